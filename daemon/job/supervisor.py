"""Supervise one job's child: have its source start it with the job, turn the stream of what it says into
events, and watch its time and its silence.

Returns the child's `TrainResult`, or raises `JobFailed` with the child's own account of its
failure or one derived from how it ended. Everything goes through the child's handle
(daemon/children/processes.py's `ChildHandle`: its messages, its stop, its exit), so a child elsewhere is
supervised as one here. A job past its timeout or silent while it trains is
stopped through the job's one way to stop (`JobRunner.stop`), handed in as `stop`; the stop
(`Stop`) says why, and the job decides what that ends in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import structlog

from daemon.children.processes import ChildExit, ChildHandle, ChildJob, ChildPlace, ChildSource
from daemon.errors import EngineUnreachable
from daemon.job.events import JobEvents
from daemon.job.lifecycle import Stop
from daemon.job.plan import JobPlace
from daemon.job.uploads import CheckpointUploads, Where
from daemon.settings import Settings
from handlers.protocol import (
    CheckpointSaved,
    ChildError,
    ChildMessage,
    FirstStep,
    JobFailed,
    JobSpec,
    ProgressReport,
    StageEntered,
    StoppedAtCheckpoint,
    TrainResult,
)
from schemas.events import STAGES, Checkpoint, Progress, Stage, Started, Waiting
from schemas.request import RequestBase

log = structlog.get_logger()

# The stages in which a child reports every few seconds, so silence means stuck: training and
# evaluation steps, and loading the model, through which the child beats from a thread
# (handlers/toolkit/reporting.py) that a hang holding the interpreter (a library's regex backtracking on
# module names) silences.
WATCHED_STAGES = frozenset({"load_model", "train", "evaluate"})


STALLED = {
    "load_model": "no sign of life while loading the model",
    "train": "no step of training",
    "evaluate": "no step of evaluation",
}


def event_stage(stage: str) -> Stage:
    """A child's stage as a `failed` event names it (the child's own `done` counts as `save`)."""
    return stage if stage in STAGES else "save"  # type: ignore[return-value]


@dataclass
class ChildOutcome:
    """What a child's messages came to: its result or its own account of its failure, and the time of its first
    step. (Its stage is followed by its supervisor, from the same messages.)"""

    result: TrainResult | None = None
    error: ChildError | None = None
    first_step_at: float | None = None

    def take(self, message: ChildMessage) -> None:
        if isinstance(message, TrainResult):
            self.result = message
        elif isinstance(message, ChildError):
            self.error = message
        elif isinstance(message, FirstStep):
            self.first_step_at = message.time


def failure_of(outcome: ChildOutcome, exited: ChildExit, stage: str) -> JobFailed | None:
    """The child's own account of its failure, or one derived from how it ended in `stage`."""
    if outcome.error is not None:
        error = outcome.error
        return JobFailed(error.code, event_stage(error.stage), error.message, retryable=error.retryable)
    if exited.returncode != 0 or outcome.result is None:
        tail = " | ".join(line.strip() for line in exited.log_tail[-5:] if line.strip())
        return JobFailed(
            "child_crashed",
            event_stage(stage),
            f"the training process died ({exited.describe()}) during {stage}; last output: {tail or '(none)'}",
            retryable=True,
        )
    return None


def time_limit(requested: int | None, most: int | None) -> int | None:
    """The job's wall-clock limit: what the request asked for, capped by the operator's maximum."""
    if requested is None:
        return most
    return requested if most is None else min(requested, most)


class Supervisor:
    def __init__(
        self,
        request: RequestBase,
        settings: Settings,
        events: JobEvents,
        children: ChildSource,
        *,
        place: JobPlace,
        stop: Callable[[Stop], bool],
        uploads: CheckpointUploads | None = None,
    ) -> None:
        self.request = request
        self.settings = settings
        self.events = events  # the job's one way to publish (daemon/job/events.py)
        self.children = children
        self.place = place  # its slot, its devices, and on a shared GPU the memory its child is held to (for `started`)
        self.timeout_s = time_limit(
            request.timeout_s, settings.max_timeout_s
        )  # counted from its child's start (`_timeout`)
        self.stop_job = stop  # JobRunner.stop: the job's one way to stop early
        self.uploads = uploads  # where each checkpoint the child saves goes (daemon/job/uploads.py)
        self.resumed: tuple[int, Where] | None = None  # the checkpoint this run resumes from, and where it came from
        self.log = log.bind(request_id=request.request_id, method=request.method, slot=place.slot)
        self.stage = "preflight"  # the child's stage, as its messages say: the one place it is kept
        self.progress: dict[str, Any] = {}
        self.progress_at: float | None = None  # when the last progress report came (its eta_s counts from then)
        self.checkpoint_step: int | None = (
            None  # the last checkpoint the child saved (what a preemption would resume from)
        )
        self.stopped_step: int | None = (
            None  # the step the child stopped at, when it saved a checkpoint on being asked to stop
        )
        self.child: ChildHandle | None = None  # its handle, once its source has started it
        self._following = False  # while its messages are read: a stop then reaches it (`stop_child`)
        self._stopped = False  # a stop has ended it (`stop_child`): one at once on a cancel is not wanted too
        self.last_heard = time.monotonic()  # the last message from the child, for the stall watchdog

    async def stop_child(self, grace_s: float) -> None:
        """End the running child through its handle: a stop at a checkpoint, killed after `grace_s` (at once for 0);
        nothing when no child runs. Its messages then end, and `train` with how it ended."""
        if self.child is not None and self._following:
            await self.child.stop(grace_s)
            self._stopped = True

    async def train(self, spec: JobSpec) -> tuple[TrainResult, float | None]:
        """Run the job in a child; its result and the time of its first optimizer step. Cancelled (the daemon going
        down) without a stop first, the child is killed at once."""
        resources = self.request.resources
        job = ChildJob(
            spec, self.place.visible_devices, resources.gpus, self.events.attempt, self.place.engine, resources.hosts
        )
        # Which kind of child (forked, warm, cold, a launcher, one elsewhere) and where its spec goes: the
        # source's choice.
        child = self.child = await self._start(job)
        self._following = True
        outcome = ChildOutcome()
        watches = [asyncio.create_task(self._timeout()), asyncio.create_task(self._stall())]
        try:
            messages = child.messages()
            try:
                await self._on_start(child.place)
                async for message in messages:  # to the child's end: its own, or a stop's (JobRunner.stop)
                    await self._on_message(message, outcome)
            except BaseException:
                if not self._stopped:
                    await child.stop(0)
                await self._drain(messages, outcome)
                raise
            exited = await child.wait()
        finally:
            self._following = False
            for watch in watches:
                watch.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        failure = failure_of(outcome, exited, self.stage)
        if failure is not None:
            raise failure
        assert outcome.result is not None
        return outcome.result, outcome.first_step_at

    async def _start(self, job: ChildJob) -> ChildHandle:
        """The job's child from its source; while the engine it runs on does not answer (a Ray cluster away), the job
        waits and says so in one `waiting` event, asking again every `ray.retry_s`: an outage fails no job."""
        said = False
        while True:
            try:
                return await self.children.start(job)
            except EngineUnreachable as exc:
                self.log.warning("job.engine_unreachable", error=str(exc))
                if not said:
                    await self.events.publish(Waiting, after=[], engine=str(exc))
                    said = True
                await asyncio.sleep(self.settings.ray.retry_s if self.settings.ray is not None else 30.0)

    async def _drain(self, messages: AsyncIterator[ChildMessage], outcome: ChildOutcome) -> None:
        """After a stop: what the child said while stopping (the checkpoint it saved), now that it has ended."""
        try:
            async with asyncio.timeout(5):
                async for message in messages:
                    await self._on_message(message, outcome)
        except (TimeoutError, ValueError) as exc:
            self.log.warning(
                "child.unread_messages", child=self.child.place.where if self.child else None, error=repr(exc)
            )

    def stop_steps(self) -> tuple[int | None, int | None]:
        """Where a stopped job stopped, and the step of the checkpoint it resumes from (the work it kept). The first is
        the checkpoint the child saved on the stop, else its last progress report, which is sent at most every
        progress_interval_s and so may trail the step it reached by many; the second its last checkpoint of this run,
        else the one this run resumed from (None: none, it starts over)."""
        stopped = self.stopped_step if self.stopped_step is not None else self.progress.get("step")
        kept = self.checkpoint_step if self.checkpoint_step is not None else (self.resumed[0] if self.resumed else None)
        return stopped, kept

    async def _on_start(self, started: ChildPlace) -> None:
        self.log.info(
            "job.started",
            child=started.where,
            child_log=started.log,
            visible_devices=self.place.visible_devices,
            timeout_s=self.timeout_s,
        )
        await self.events.publish(
            Started,
            method=self.request.method,
            slot=self.place.slot,
            pid=started.pid,
            child=started.where,
            endpoint=self.settings.logs_endpoint,
            endpoint_scheme=self.settings.logs_endpoint_scheme,
            memory_share_bytes=self.place.share_bytes,
            resumed_step=self.resumed[0] if self.resumed else None,
            resumed_from=self.resumed[1] if self.resumed else None,
            gpus=self.request.resources.gpus if self.place.engine == "ray" else None,
        )

    async def _on_message(self, message: ChildMessage, outcome: ChildOutcome) -> None:
        self.last_heard = time.monotonic()
        outcome.take(message)
        if isinstance(message, ProgressReport):
            fields = message.model_dump(exclude={"kind"})
            self.progress = {"step": message.step, "total_steps": message.total_steps, "eta_s": message.eta_s}
            self.progress_at = time.time()
            await self.events.publish(Progress, **fields)
        elif isinstance(message, CheckpointSaved):
            self.log.info("job.checkpoint", step=message.step, path=message.path)
            self.checkpoint_step = message.step
            if self.uploads is not None:
                await self.uploads.saved(message.step, message.path)
            else:
                await self.events.publish(Checkpoint, step=message.step, path=message.path)
        elif isinstance(message, StoppedAtCheckpoint):
            self.log.info("job.stopped_at_checkpoint", step=message.step, path=message.path)
            self.stopped_step = message.step
        elif isinstance(message, StageEntered):
            self.stage = message.stage
            self.log.info("job.stage", stage=message.stage)

    async def _timeout(self) -> None:
        """Stop the job once it has run `timeout_s` (from its child's start)."""
        if self.timeout_s is None:
            return
        await asyncio.sleep(self.timeout_s)
        self.stop_job(Stop("timeout", f"timeout_s: the job ran longer than {self.timeout_s} s and was stopped"))

    async def _stall(self) -> None:
        """Stop the job once it has gone `stall_timeout_s` without a sign of life in a watched stage
        (a hung collective, a stuck data loader): there, the child says something every few seconds."""
        limit = self.settings.stall_timeout_s
        if limit is None:
            return
        while True:
            await asyncio.sleep(min(limit / 4, 5.0))
            if self.stage in WATCHED_STAGES and time.monotonic() - self.last_heard > limit:
                self.log.warning("job.stalled", silent_s=round(time.monotonic() - self.last_heard, 1))
                self.stop_job(
                    Stop("stalled", f"{STALLED[self.stage]} for {limit} s (stall_timeout_s); the job was stopped")
                )
                return
