"""One accepted request's lifecycle, to its terminal event: an earlier success answered again, or
training in a child (`daemon.job.supervisor`), then the push, then `succeeded`; or `failed`,
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
from dataclasses import dataclass, field
from typing import Any

import structlog

from daemon import executors
from daemon.children.processes import ChildSource
from daemon.hub import push as hub_push
from daemon.job.events import JobEvents
from daemon.job.gate import Destination, destination, judge
from daemon.job.lifecycle import Lifecycle, State, Stop
from daemon.job.memory import fast_settings, reported_memory
from daemon.job.plan import JobPlace, MemoryPlan
from daemon.job.report import stage_durations, write_card
from daemon.job.spec import job_spec
from daemon.job.succeeded import earlier_success, succeeded_event
from daemon.job.supervisor import Supervisor, event_stage
from daemon.job.uploads import CheckpointUploads, fetch
from daemon.kafka.publisher import Publisher
from daemon.kafka.trace import Headers, traceparent
from daemon.ops.metrics import JOBS
from daemon.settings import Settings
from daemon.store.journal import Journal
from daemon.store.opening import store_of
from handlers.protocol import FastSettings, JobFailed, StartPoint, TrainResult
from schemas.evaluation import EvaluationReport
from schemas.events import Cancelled, EventBase, Failed, Retrying, Succeeded
from schemas.request import RequestBase

log = structlog.get_logger()


@dataclass(frozen=True)
class Arrival:
    """The request a job runs, as this attempt received it."""

    request: RequestBase
    received_at: float  # wall-clock time the request reached Kafka
    attempt: int = 1
    trace: Headers = field(default_factory=list)  # its W3C trace headers (daemon/kafka/trace.py), on each of its events
    start: StartPoint | None = None  # what its `start_from` published (daemon/jobs/prerequisites.py)


@dataclass(frozen=True)
class JobServices:
    """What every job of the host runs with: the settings, the publisher of its events, the source of its children."""

    settings: Settings
    publisher: Publisher
    children: ChildSource


class JobRunner:
    """One request's job on its slots. `run()` returns the published terminal (or `retrying`) event,
    or None when the job was interrupted (nothing published: the request is read again).

    `stop(Stop)` is the one way a job ends early (a cancel, its timeout, a stall, an interrupt):
    see `stop` and daemon/job/lifecycle.py.
    """

    def __init__(
        self,
        arrival: Arrival,
        services: JobServices,
        place: JobPlace,
        *,
        memory: MemoryPlan | None = None,
        on_trained: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        request, settings = arrival.request, services.settings
        self.request = request
        # its slots and devices, and on a GPU shared with other jobs its share, which its child is held to
        self.place = place
        self.memory = memory or MemoryPlan()  # its estimate, a whole GPU's room and the estimator its peak teaches
        # the speed settings its child trained with, this attempt (none: read back from the journal)
        self.fast: FastSettings | None = None
        # Called once the child has exited with its result: the GPUs are free for the next job while
        # this one is judged and pushed (the scheduler gives its slots back then).
        self.on_trained = on_trained
        self.trace = arrival.trace
        self.start = arrival.start
        self.settings = settings
        self.received_at = arrival.received_at
        self.attempt = arrival.attempt
        # The child runs in it: paths in its spec stay absolute. A job on Ray: on the folder the cluster shares.
        jobs_dir = settings.ray.shared_dir if place.engine == "ray" and settings.ray is not None else settings.jobs_dir
        self.job_dir = (jobs_dir / request.request_id).absolute()
        self.journal = Journal(self.job_dir / "journal.json")
        self.log = log.bind(
            request_id=request.request_id, method=request.method, slot=place.slot, traceparent=traceparent(self.trace)
        )
        # every event of the job goes through it
        self.events = JobEvents(services.publisher, request, settings.host, arrival.attempt, self.trace)
        # Its checkpoints into the operator's store, when there is one (daemon/job/uploads.py).
        self.uploads = CheckpointUploads(
            store_of(settings),
            request.request_id,
            self.job_dir,
            self.journal,
            self.events,
            settings.checkpoint_store_keep,
        )
        self.supervisor = Supervisor(
            request, settings, self.events, services.children, place=place, stop=self.stop, uploads=self.uploads
        )
        self.lifecycle = Lifecycle()  # daemon/job/lifecycle.py: its states, their transitions, and why it stops early
        self._work: asyncio.Task[EventBase] | None = None
        self._stopping: asyncio.Task[None] | None = None
        self._deadline: float | None = None  # a stop's: its child's save and the upload of that checkpoint end by then

    @property
    def stage(self) -> str:
        """Where the job is, in the stages events name: the child's own while it trains."""
        state = self.lifecycle.state
        return self.supervisor.stage if state is State.TRAINING else "push" if state is State.PUSHING else state.value

    def stop(self, stop: Stop) -> bool:
        """End the job early, the one way it is done: record why (its lifecycle's `stop`), give a
        running child `stop.grace_s` to save a checkpoint (`ChildHandle.stop`), then end the job's
        own work. `run()` then reads the stop alone to decide what the job ends in. False when it
        is too late (see `Lifecycle.request_stop`)."""
        if not self.lifecycle.request_stop(stop):
            return False
        self.log.info("job.stopping", kind=stop.kind, reason=stop.reason, grace_s=stop.grace_s, stage=self.stage)
        if self._deadline is None:
            self._deadline = time.monotonic() + stop.grace_s
        if self._stopping is None:
            self._stopping = asyncio.create_task(self._end_work(), name=f"stop-{self.request.request_id}")
        return True

    async def _end_work(self) -> None:
        """The child stopped with the grace of the stop in force when this runs (an interrupt asked
        for just after a cancel gives it the interrupt's), then the work ended."""
        assert self.lifecycle.stop is not None
        await self.supervisor.stop_child(self.lifecycle.stop.grace_s)
        if self._work is not None:
            self._work.cancel()

    def status(self) -> dict[str, Any]:
        return {
            "request_id": self.request.request_id,
            "method": self.request.method,
            "slot": self.place.slot,
            "stage": self.stage,
            "pid": self.supervisor.child.place.pid if self.supervisor.child else None,
            "child": self.supervisor.child.place.where if self.supervisor.child else None,
            "memory_share_bytes": self.place.share_bytes,
            "memory_estimate_bytes": self.memory.estimate.needed if self.memory.estimate is not None else None,
            **self.supervisor.progress,
        }

    async def run(self) -> EventBase | None:
        """The job to its published terminal (or `retrying`) event; None when it was interrupted
        (nothing is published). A stop, when there is one, decides the end: `_ended_by`."""
        outcome: EventBase | None = None
        if self.lifecycle.stop is None:  # else stopped between its acceptance and its start
            self._work = asyncio.create_task(self._outcome(), name=f"work-{self.request.request_id}")
            try:
                outcome = await self._work
            except asyncio.CancelledError:
                if self.lifecycle.stop is None:
                    raise  # not a stop of the job's: the task running it was cancelled (the daemon is going down)
        if self._stopping is not None:
            await self._stopping  # its child is gone before its end is published
        stop = self.lifecycle.stop
        if isinstance(outcome, Succeeded) and (stop is None or stop.kind != "interrupt"):
            # Published: its checkpoints in the store serve no one now; its event there
            # answers a redelivery on any host.
            await self.uploads.abandon(None if outcome.duplicate else outcome.model_dump(mode="json"))
        else:  # its last checkpoint reaches the store (within a stop's deadline) before its end is said
            await self.uploads.finish(None if self._deadline is None else max(0.0, self._deadline - time.monotonic()))
        # A success stands against any stop but an interrupt: it is pushed and in the journal.
        event = (
            outcome
            if stop is None or (stop.kind != "interrupt" and isinstance(outcome, Succeeded))
            else self._ended_by(stop)
        )
        if event is None:
            assert stop is not None
            self.lifecycle.to(State.INTERRUPTED)
            self.log.warning("job.interrupted", reason=stop.reason, committed=False)
            return None
        if isinstance(event, Failed | Retrying):
            self.log.warning(
                "job.failed",
                code=event.code,
                stage=event.stage,
                error=event.message,
                attempt=self.attempt,
                outcome=event.type,
            )
        elif isinstance(event, Cancelled):
            self.log.info("job.cancelled", reason=event.reason)
        await self.events.announce(event)
        self.lifecycle.to(State(event.type))
        if event.type != "retrying":
            JOBS.labels(event.type).inc()
        return event

    def _ended_by(self, stop: Stop) -> EventBase | None:
        """What a stopped job ends in: `cancelled`; `failed` or `retrying` for its timeout (never
        retried: it would run as long again) or a stall; nothing for an interrupt."""
        if stop.kind == "interrupt":
            return None
        if stop.kind == "cancel":
            return self.events.event(Cancelled, reason=stop.reason)
        return self._failure(
            JobFailed(stop.kind, event_stage(self.supervisor.stage), stop.reason, retryable=stop.kind == "stalled")
        )

    def _failure(self, failure: JobFailed) -> Failed | Retrying:
        """A failed attempt: `retrying` while a retryable failure has attempts left, else `failed`.
        Out of memory on a shared GPU is not the job's failure: it runs again on a GPU of its own,
        whatever attempt it is on (`alone`)."""
        message = failure.message
        if failure.code == "out_of_memory" and self.place.share is not None:
            message += (
                f" (on a GPU shared with other jobs, held to {self.place.share.share_bytes} bytes, "
                f"{self.place.share.fraction} of it); it runs again on a GPU of its own"
            )
        elif not (failure.retryable and self.attempt < self.settings.max_attempts):
            return self.events.event(
                Failed, code=failure.code, message=message, stage=failure.stage, retryable=failure.retryable
            )
        return self.events.event(
            Retrying, code=failure.code, message=message, stage=failure.stage, max_attempts=self.settings.max_attempts
        )

    async def _outcome(self) -> EventBase:
        started = time.monotonic()
        queued_s = max(0.0, time.time() - self.received_at)
        try:
            earlier = await earlier_success(
                self.request, self.settings, self.journal, self.uploads, self.events, self.log
            )
            if earlier is not None:
                return earlier
            result, first_step_at = await self._trained()
            if self.on_trained is not None:
                await self.on_trained()
            report, where = self._judged(result)
            write_card(
                self.job_dir / "artifact", self.request, result, report, self.settings, self.start
            )  # also on an artifact kept on the host: it says why
            push_started = time.monotonic()
            if where.published == "none":
                pushed = hub_push.kept_on_host(self.job_dir / "artifact", self.request, self.settings)
            else:
                self.lifecycle.to(State.PUSHING)
                pushed = await self._push(where)
        except JobFailed as failure:
            return self._failure(failure)
        durations = stage_durations(
            result,
            received_at=self.received_at,
            queued_s=queued_s,
            started=started,
            push_started=push_started,
            first_step_at=first_step_at,
        )
        succeeded = succeeded_event(
            self.events,
            self.request,
            result,
            pushed,
            durations,
            report=report,
            published=where.published,
            memory=reported_memory(
                self.request, self.memory.estimate, self.place.share, result.memory, self.memory.estimator, self.fast
            ),
        )
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
        fast = self.fast = await fast_settings(
            self.request, self.settings, self.place.share, self.memory.gpu_room, self.memory.estimator, self.log
        )
        spec = job_spec(
            self.request,
            self.settings,
            self.job_dir,
            traceparent(self.trace),
            memory_fraction=self.place.share.fraction if self.place.share is not None else None,
            fast=fast,
            start=self.start,
        )
        self.journal.forget("trained")  # an earlier attempt's result: this attempt trains the artifact anew
        if self.place.engine == "local":  # a half-written artifact from an earlier attempt
            # (A run on Ray may have finished this attempt's, whole, before a restart: its source removes it only
            # when it submits a new run, daemon/children/ray_jobs.py.)
            shutil.rmtree(spec.artifact, ignore_errors=True)
        # The newest checkpoint, from this host or from the store (an attempt on another
        # host): the trainer resumes there.
        self.supervisor.resumed = await asyncio.to_thread(
            fetch, self.uploads.store, self.request.request_id, spec.checkpoints
        )
        result, first_step_at = await self.supervisor.train(spec)  # its source writes it where its child reads it
        self.journal.record("trained", result.model_dump(mode="json"))
        return result, first_step_at

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
        self.log.info(
            "job.judged",
            verdict=report.verdict,
            published=where.published,
            branch=where.branch,
            failed=[rule.rule for rule in report.rules if rule.outcome == "failed"],
        )
        return report, where

    async def _push(self, where: Destination) -> hub_push.PushResult:
        artifact = self.job_dir / "artifact"
        pushed = await executors.run(
            "hub", hub_push.push, artifact, self.request, self.settings, where.branch, create_pr=where.published == "pr"
        )
        self.log.info(
            "job.pushed",
            sink=pushed.sink,
            commit_sha=pushed.commit_sha,
            location=pushed.location,
            published=where.published,
        )
        return pushed
