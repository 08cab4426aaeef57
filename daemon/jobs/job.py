"""One accepted request's lifecycle, to its terminal event: an earlier success answered again, or
training in a child (`daemon.jobs.supervisor`), then the push, then `succeeded`; or `failed`,
`retrying` or `cancelled`.

Every event of the job is published (and acknowledged) before the next step; the terminal event is
returned so the scheduler can commit the request's offset. The journal in the job's folder makes
each step happen once per request id: a trained artifact is pushed without training again, and a
request that already succeeded is answered with its `succeeded`, marked duplicate.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from daemon.children.processes import ChildSource
from daemon.hub import push as hub_push
from daemon.hub.model_card import model_card
from daemon.jobs.gate import Destination, destination, judge
from daemon.jobs.job_events import JobEvents
from daemon.jobs.journal import Journal
from daemon.jobs.lifecycle import Lifecycle, State, Stop
from daemon.jobs.spec import job_spec
from daemon.jobs.succeeded import FOUND_ON_THE_HUB, succeeded_event
from daemon.jobs.supervisor import Supervisor
from daemon.kafka.publisher import Publisher
from daemon.kafka.trace import Headers, traceparent
from daemon.ops.metrics import JOBS, STAGE_SECONDS
from daemon.settings import Settings
from handlers.protocol import JobFailed, TrainResult
from schemas.evaluation import EvaluationReport, Published
from schemas.events import Cancelled, EventBase, Failed, Retrying, Succeeded
from schemas.request import RequestBase

log = structlog.get_logger()


def _timeout(requested: int | None, most: int | None) -> int | None:
    """The job's wall-clock limit: what the request asked for, capped by the operator's maximum."""
    if requested is None:
        return most
    return requested if most is None else min(requested, most)


class JobRunner:
    """One request's job on its slots. `run()` returns the published terminal event.

    `cancel()` ends the job in `cancelled`. Cancelling the task that awaits `run()` (the daemon
    stops, the partition moved) stops the child's process group and publishes nothing, so the
    request is read again.
    """

    def __init__(
        self, request: RequestBase, settings: Settings, publisher: Publisher, children: ChildSource,
        received_at: float, slot: str, visible_devices: str | None, attempt: int = 1, trace: Headers | None = None,
        on_trained: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.request = request
        # Called once the child has exited with its result: the GPUs are free for the next job while
        # this one is judged and pushed (the scheduler gives its slots back then).
        self.on_trained = on_trained
        self.trace = trace or []  # the request's W3C trace headers (daemon/kafka/trace.py), on each of its events
        self.settings = settings
        self.received_at = received_at  # wall-clock time the request reached Kafka
        self.slot = slot
        self.attempt = attempt
        self.job_dir = (settings.jobs_dir / request.request_id).absolute()  # the child runs in it: paths in its spec stay absolute
        self.journal = Journal(self.job_dir / "journal.json")
        self.log = log.bind(request_id=request.request_id, method=request.method, slot=slot, traceparent=traceparent(self.trace))
        self.events = JobEvents(publisher, request, settings.host, attempt, self.trace)  # every event of the job goes through it
        self.supervisor = Supervisor(
            request, settings, self.events, children, slot=slot, visible_devices=visible_devices,
            timeout_s=_timeout(request.timeout_s, settings.max_timeout_s),
        )
        self.lifecycle = Lifecycle()  # daemon/jobs/lifecycle.py: its states, their transitions, and why it stops early
        self._work: asyncio.Task[EventBase] | None = None

    @property
    def stage(self) -> str:
        """Where the job is, in the stages events name: the child's own while it trains."""
        state = self.lifecycle.state
        return self.supervisor.stage if state is State.TRAINING else "push" if state is State.PUSHING else state.value

    def interrupt(self, reason: str, grace_s: float) -> None:
        """Before the task running the job is cancelled (a daemon stop, a partition that moved): it
        publishes nothing, and its child gets `grace_s` to save a checkpoint."""
        if self.lifecycle.request_stop(Stop("interrupt", reason)):
            self.supervisor.stop_at_checkpoint(grace_s)

    def cancel(self, reason: str) -> bool:
        """Stop the job for a cancel request: it ends in `cancelled`. False once the push has begun: too late."""
        if not self.lifecycle.request_stop(Stop("cancel", reason)):
            return False
        if self._work is not None:
            self._work.cancel()  # stops the child's process group at once
        return True

    def status(self) -> dict[str, Any]:
        return {
            "request_id": self.request.request_id, "method": self.request.method, "slot": self.slot,
            "stage": self.stage, "pid": self.supervisor.child.pid if self.supervisor.child else None,
            **self.supervisor.progress,
        }

    async def run(self) -> EventBase:
        """The job to its published terminal (or `retrying`) event. Cancelling the task that awaits
        this (a daemon stop, a partition that moved) stops the child and publishes nothing."""
        self._work = asyncio.create_task(self._outcome(), name=f"work-{self.request.request_id}")
        if self.lifecycle.stop is not None:
            self._work.cancel()  # stopped between its acceptance and its start
        try:
            event = await self._work
        except asyncio.CancelledError:
            stop = self.lifecycle.stop
            if stop is None or stop.kind == "interrupt":
                self.lifecycle.to(State.INTERRUPTED)
                raise  # nothing is published: the request is read again
            self.log.info("job.cancelled", reason=stop.reason)
            event = Cancelled(**self.events.common(), reason=stop.reason)
        await self.events.announce(event)
        self.lifecycle.to(State(event.type))
        if event.type != "retrying":
            JOBS.labels(event.type).inc()
        return event

    async def _outcome(self) -> EventBase:
        started = time.monotonic()
        queued_s = max(0.0, time.time() - self.received_at)
        try:
            earlier = await self._earlier_success()
            if earlier is not None:
                return earlier
            result, first_step_at = await self._trained()
            if self.on_trained is not None:
                await self.on_trained()
            report, where = self._judged(result)
            self._write_card(result, report)  # also on an artifact kept on the host: it says why
            push_started = time.monotonic()
            if where.published == "none":
                pushed = hub_push.kept_on_host(self.job_dir / "artifact", self.request, self.settings)
            else:
                self.lifecycle.to(State.PUSHING)
                pushed = await self._push(where)
        except JobFailed as failure:
            self.log.warning("job.failed", code=failure.code, stage=failure.stage, error=failure.message, attempt=self.attempt)
            if failure.retryable and self.attempt < self.settings.max_attempts:
                return Retrying(**self.events.common(), code=failure.code, message=failure.message, stage=failure.stage,
                                max_attempts=self.settings.max_attempts)
            return Failed(**self.events.common(), code=failure.code, message=failure.message, stage=failure.stage, retryable=failure.retryable)
        durations = {
            "queue": round(queued_s, 3),
            **result.durations_s,
            "push": round(time.monotonic() - push_started, 3),
            "total": round(time.monotonic() - started + queued_s, 3),
        }
        if first_step_at is not None:
            durations["until_first_step"] = round(first_step_at - self.received_at, 3)
        for stage, seconds in durations.items():
            STAGE_SECONDS.labels(stage).observe(seconds)
        succeeded = succeeded_event(self.events, self.request, result, pushed, durations, report=report, published=where.published)
        self.journal.record("succeeded", succeeded.model_dump(mode="json"))
        return succeeded

    async def _trained(self) -> tuple[TrainResult, float | None]:
        """The child's result, and the time of its first step: an earlier attempt's when its
        artifact is complete on disk (nothing is trained twice), else this attempt's."""
        trained = self.journal.read().get("trained")
        if trained is not None and (self.job_dir / "artifact").is_dir():
            self.log.info("job.already_trained", artifact=str(self.job_dir / "artifact"))
            return TrainResult.model_validate(trained), None
        self.lifecycle.to(State.TRAINING)
        self.job_dir.mkdir(parents=True, exist_ok=True)
        spec = job_spec(self.request, self.settings, self.job_dir, traceparent(self.trace))
        spec_path = self.job_dir / "spec.json"
        spec_path.write_text(spec.model_dump_json(indent=2))
        self.journal.record("trained", None)  # until this attempt's artifact is complete
        shutil.rmtree(spec.artifact, ignore_errors=True)  # a half-written artifact from an earlier attempt
        result, first_step_at = await self.supervisor.train(spec_path, self.job_dir / "child.log")
        self.journal.record("trained", result.model_dump(mode="json"))
        return result, first_step_at

    async def _earlier_success(self) -> Succeeded | None:
        """This request's `succeeded` again, marked duplicate, when an earlier attempt got that far:
        from this host's journal, or from the Hub commit that records the request id."""
        recorded = self.journal.read().get("succeeded")
        if recorded is not None:
            earlier = Succeeded.model_validate(recorded)
            self.log.info("job.duplicate", commit_sha=earlier.commit_sha, found_in="journal")
            return Succeeded(**{**earlier.model_dump(exclude={"event_id", "time"}), **self.events.common(), "duplicate": True})
        found = await asyncio.to_thread(hub_push.find_commit, self.request, self.settings)
        if found is None:
            return None
        self.log.info("job.duplicate", commit_sha=found.commit_sha, found_in="hub")
        published: Published = "pr" if found.pr_url else "main" if found.revision == self.request.output.revision else "branch"
        return succeeded_event(self.events, self.request, FOUND_ON_THE_HUB, found, {}, duplicate=True, published=published)

    def _judged(self, result: TrainResult) -> tuple[EvaluationReport | None, Destination]:
        """Stage JUDGING for a request with an evaluation: its gate against the child's numbers, and
        where that sends the artifact (the requested revision when there is no gate)."""
        if self.request.evaluation is None:
            return None, destination(self.request, None)
        self.lifecycle.to(State.JUDGING)
        if result.evaluation is None:
            raise JobFailed("internal", "evaluate", "the child trained a request with an evaluation and reported none")
        report = judge(self.request.evaluation, result.evaluation)
        where = destination(self.request, report)
        self.log.info("job.judged", verdict=report.verdict, published=where.published, branch=where.branch,
                      failed=[rule.rule for rule in report.rules if rule.outcome == "failed"])
        return report, where

    def _write_card(self, result: TrainResult, report: EvaluationReport | None) -> None:
        card = model_card(
            self.request, result.trainer, result.base_model_revision, result.metrics, result.versions,
            dataset_sources=result.dataset_sources, dataset_fingerprint=result.dataset_fingerprint,
            local_model_hub_ids=self.settings.local_model_hub_ids, pipeline_tag=result.pipeline_tag, tracking=result.tracking,
            evaluation=report,
        )
        (self.job_dir / "artifact" / "README.md").write_text(card)

    async def _push(self, where: Destination) -> hub_push.PushResult:
        artifact = self.job_dir / "artifact"
        pushed = await asyncio.to_thread(hub_push.push, artifact, self.request, self.settings, where.branch, create_pr=where.published == "pr")
        self.log.info("job.pushed", sink=pushed.sink, commit_sha=pushed.commit_sha, location=pushed.location, published=where.published)
        return pushed
