"""This host's claimed jobs as the fleet sees them, and preemption: stop one at its checkpoint and send its
request back to its class's queue without spending an attempt. `ClaimedJobs` is the scheduler's fleet hooks
(daemon/jobs/fleet_hooks.py), given to it at its construction (daemon/service.py `wire`); the dispatcher asks
it of the scheduler's jobs (`running`, `held`, `preempt`).

A preempted job is stopped like a daemon stop (`Stop.interrupt`: the child saves a checkpoint within
`drain_timeout_s`, uploaded to the checkpoint store when there is one). Its claim is then moved back to
the end of its class's queue in one transaction that commits the claim (daemon/fleet/moves.py), with its
signed count of preemptions (daemon/kafka/retry_state.py) and its attempt headers as they were; the
`preempted` event names the request that took the slot. Whoever runs it next resumes from the checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

import structlog
from aiokafka import TopicPartition

from daemon.fleet.moves import Copy, Move, Mover, Stale, carried
from daemon.fleet.policy.order import FleetJob
from daemon.job.lifecycle import Stop
from daemon.job.runner import JobRunner
from daemon.jobs.offered import RunningJob
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Outgoing
from daemon.kafka.queue_seal import Unsealed
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.ops import metrics
from daemon.resources.slots import Slots
from daemon.settings import Settings
from daemon.settings.fleet import team_of
from schemas import Preempted, RequestBase

log = structlog.get_logger()


def claimed_class(record: Record, request: RequestBase, settings: Settings) -> str:
    """The class a claimed request runs as (`Settings.runs_as`)."""
    return settings.runs_as(record.headers, request.priority_class) or ""


class ClaimedJobs:
    """Holds what the scheduler's jobs need for the fleet: when each started, and which are being preempted."""

    drains = (
        True  # the fleet drains a host for a request of several GPUs (daemon/fleet/policy/drain.py), not the scheduler
    )

    def __init__(
        self, settings: Settings, mover: Mover, retries: RetrySigner, slots: Slots, claims: Partitions
    ) -> None:
        self.settings = settings
        self.slots = slots
        self.claims = claims  # the claims partitions the scheduler runs
        self.mover = mover
        self.retries = retries
        self.started: dict[TopicPartition, tuple[float, Record]] = {}
        self.preempting: dict[TopicPartition, str] = {}  # claims partition → the request id that takes its slot
        self.preemptible = {c.name for c in settings.priority_classes if c.preemptible}

    def accepted_fields(self, tp: TopicPartition, record: Record, request: RequestBase) -> dict[str, str | int]:
        self.started[tp] = (time.time(), record)
        fields: dict[str, str | int] = {
            "priority_class": claimed_class(record, request, self.settings),
            "team": team_of(request.team),
            "host_slots": self.slots.total,
            "model": request.model.id,
        }
        if request.training.max_steps is not None:
            fields["max_steps"] = request.training.max_steps
        if self.slots.kind.kind is not None:  # the waiting requests' ETAs place each on the kinds that serve it
            fields["gpu_kind"] = self.slots.kind.kind
        return fields

    def running(self, jobs: Mapping[TopicPartition, RunningJob]) -> list[FleetJob]:
        """This host's jobs (the scheduler's `jobs`) that hold slots, for the fleet's choice of a job to preempt
        (daemon/fleet/view.py)."""
        out = []
        for tp, job in jobs.items():
            if job.placement is None:
                continue  # trained: judged or pushed now, its slot free
            runner = job.runner
            started, record = self.started.get(tp, (time.time(), None))
            if record is None or tp in self.preempting:
                continue
            cls = claimed_class(record, runner.request, self.settings)
            step = runner.supervisor.progress.get("step")
            saved = runner.supervisor.checkpoint_step
            out.append(
                FleetJob(
                    request_id=runner.request.request_id,
                    priority_class=cls,
                    team=team_of(runner.request.team),
                    started=started,
                    method=runner.request.method,
                    model=runner.request.model.id,
                    preemptible=cls in self.preemptible,
                    preemptions=self.retries.preemptions(record),
                    eta_s=runner.supervisor.progress.get("eta_s"),
                    steps_since_checkpoint=None if step is None else step - (saved or 0),
                    host=self.settings.host,
                    key=tp,
                    gpus=runner.request.resources.gpus,
                    on_ray=self.slots.is_remote(job.placement),
                )
            )
        return out

    def held(self, jobs: Mapping[TopicPartition, RunningJob]) -> dict[str, tuple[str, int]]:
        """Each of this host's jobs by request id: its team and the slots it holds now, none from when its child exited
        (its slots free then, before its outcome is judged, pushed and published: daemon/jobs/scheduler.py)."""
        return {
            job.request_id: (team_of(job.runner.request.team), 0 if job.placement is None else len(job.placement.slots))
            for job in jobs.values()
        }

    def preempt(self, jobs: Mapping[TopicPartition, RunningJob], tp: object, by: str) -> bool:
        """Stop the job of claims partition `tp` (a `FleetJob`'s key; the scheduler's `jobs`) at its checkpoint so that
        request `by` takes its slot; False when there is none or it is too late (its outcome is being published)."""
        job = jobs.get(tp) if isinstance(tp, TopicPartition) else None
        if (
            job is None
            or not isinstance(tp, TopicPartition)
            or tp in self.preempting
            or not job.runner.stop(Stop.interrupt(f"preempted by {by}", self.settings.drain_timeout_s))
        ):
            return False
        self.preempting[tp] = by
        return True

    async def after_interrupt(self, tp: TopicPartition, record: Record, runner: JobRunner) -> bool:
        """After a job ended interrupted: True when it was preempted and its request is back in its queue."""
        self.started.pop(tp, None)
        by = self.preempting.pop(tp, None)
        if by is None:
            return False
        count = self.retries.preemptions(record) + 1
        if not await self.back_to_queue(tp, record, runner.request, preemptions=count):
            log.warning("job.preempted_not_requeued", request_id=runner.request.request_id, by=by)
            return False
        cls = claimed_class(record, runner.request, self.settings)
        metrics.PREEMPTIONS.inc()
        log.warning("job.preempted", request_id=runner.request.request_id, by=by, preemptions=count, priority_class=cls)
        # Where it stopped and the checkpoint it resumes from, not its last progress report, which may trail both.
        stopped, kept = runner.supervisor.stop_steps()
        await runner.events.publish(
            Preempted,
            by=by,
            priority_class=cls,
            preemptions=count,
            stopped_at_step=stopped,
            resume_from_step=kept,
            step=stopped,
        )
        return True

    async def back_to_queue(
        self, tp: TopicPartition, record: Record, request: RequestBase, *, preemptions: int | None = None
    ) -> bool:
        """A claim back to the end of its class's queue with its arrival (it keeps its place there) and its attempt
        headers, in one transaction that commits the claim; `preemptions` its new count (unchanged by default: a hold
        or a pause, daemon/jobs/holds.py). False when its claims partition moved meanwhile: whoever holds it now runs
        it, from its checkpoint."""
        cls = claimed_class(record, request, self.settings)
        back = Copy(
            record,
            self.settings.class_topics[cls],
            cls,
            team_of(request.team),
            self.arrival_ms(record),
            carried(record, self.retries, preemptions=preemptions),
        )
        try:
            await self.mover.move(Move(record, self.settings.group_id, (back,), lambda: tp in self.claims.assigned()))
        except Stale:
            return False
        return True

    def arrival_ms(self, record: Record) -> int:
        """When a claimed request arrived: what the fleet signed on its claim (intake ran none it did not sign),
        else, on a fleet that checks no signature, the claim's timestamp, which the dispatcher set to it."""
        try:
            return self.mover.seal.read(
                record.topic, record.partition, record.key, record.value, record.headers
            ).arrival_ms
        except Unsealed:
            return record.timestamp

    def requeued(self, record: Record, request: RequestBase, retry: Outgoing) -> Outgoing:
        """A claimed request's retry, to its class's queue, signed by the fleet: it arrives there now (at the end)."""
        cls = claimed_class(record, request, self.settings)
        topic = self.settings.class_topics.get(cls, self.settings.requests_topic)
        seal = self.mover.seal.headers(
            topic, None, retry.key, retry.value, cls, team_of(request.team), int(time.time() * 1000)
        )
        return dataclasses.replace(retry, topic=topic, headers=[*retry.headers, *seal])

    def forget(self, tp: TopicPartition) -> None:
        self.started.pop(tp, None)
        self.preempting.pop(tp, None)
