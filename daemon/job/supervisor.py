"""Supervise one job's child process: hand it the job, turn what it says into events, and watch its
time and its silence.

Returns the child's `TrainResult`, or raises `JobFailed` with the child's own account of its
failure or one derived from how it died. A job past its timeout or silent while it trains is
stopped through the job's one way to stop (`JobRunner.stop`), handed in as `stop`; the stop
(`Stop`) says why, and the job decides what that ends in.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from daemon.children.child import ChildOutcome
from daemon.children.processes import ChildHandle, ChildJob, ChildSource, JobProcess
from daemon.job.events import JobEvents
from daemon.job.lifecycle import Stop
from daemon.job.plan import JobPlace
from daemon.job.uploads import CheckpointUploads, Where
from daemon.settings import Settings
from handlers.protocol import (
    CheckpointSaved,
    ChildMessage,
    JobFailed,
    ProgressReport,
    StageEntered,
    StoppedAtCheckpoint,
    TrainResult,
)
from schemas.events import STAGES, Checkpoint, Progress, Stage, Started
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


def failure_of(outcome: ChildOutcome, stage: str) -> JobFailed | None:
    """The child's own account of its failure, or one derived from how it died in `stage`."""
    if outcome.error is not None:
        error = outcome.error
        return JobFailed(error.code, event_stage(error.stage), error.message, retryable=error.retryable)
    if outcome.returncode != 0 or outcome.result is None:
        tail = " | ".join(line.strip() for line in outcome.log_tail[-5:] if line.strip())
        return JobFailed(
            "child_crashed",
            event_stage(stage),
            f"the training process died ({outcome.describe_exit()}) during {stage}; last output: {tail or '(none)'}",
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
        self.child: JobProcess | None = None
        self._running: asyncio.Task[ChildOutcome] | None = None
        self.last_heard = time.monotonic()  # the last message from the child, for the stall watchdog

    async def stop_child(self, grace_s: float) -> None:
        """End the running child: SIGTERM, SIGKILL after `grace_s` (at once for 0); nothing when no
        child runs. Its `run` then returns with how it ended."""
        if self.child is not None and self._running is not None and not self._running.done():
            await self.child.stop(grace_s)

    async def train(self, spec_path: Path, log_path: Path) -> tuple[TrainResult, float | None]:
        """Run the job in a child; its result and the time of its first optimizer step."""
        job = ChildJob(spec_path, log_path, self.place.visible_devices, self.request.resources.gpus)
        child = await self.children.start(
            job
        )  # which kind of child (forked, warm, cold, a launcher) is the source's choice
        self.child = child
        child.log_context = {"request_id": self.request.request_id}
        self._running = run = asyncio.create_task(child.run(job, self._on_start, self._on_message))
        watches = [asyncio.create_task(self._timeout()), asyncio.create_task(self._stall())]
        try:
            outcome = await run  # to the child's end: its own, or a stop's (JobRunner.stop)
        finally:
            for watch in watches:
                watch.cancel()
            await asyncio.gather(*watches, return_exceptions=True)
        failure = failure_of(outcome, self.stage)
        if failure is not None:
            raise failure
        assert outcome.result is not None
        return outcome.result, outcome.first_step_at

    def stop_steps(self) -> tuple[int | None, int | None]:
        """Where a stopped job stopped, and the step of the checkpoint it resumes from (the work it kept). The first is
        the checkpoint the child saved on the stop, else its last progress report, which is sent at most every
        progress_interval_s and so may trail the step it reached by many; the second its last checkpoint of this run,
        else the one this run resumed from (None: none, it starts over)."""
        stopped = self.stopped_step if self.stopped_step is not None else self.progress.get("step")
        kept = self.checkpoint_step if self.checkpoint_step is not None else (self.resumed[0] if self.resumed else None)
        return stopped, kept

    async def _on_start(self, handle: ChildHandle) -> None:
        self.log.info(
            "job.started", child=handle.where, visible_devices=self.place.visible_devices, timeout_s=self.timeout_s
        )
        await self.events.publish(
            Started,
            method=self.request.method,
            slot=self.place.slot,
            pid=handle.pid,
            child=handle.where,
            endpoint=self.settings.logs_endpoint,
            endpoint_scheme=self.settings.logs_endpoint_scheme,
            memory_share_bytes=self.place.share_bytes,
            resumed_step=self.resumed[0] if self.resumed else None,
            resumed_from=self.resumed[1] if self.resumed else None,
        )

    async def _on_message(self, message: ChildMessage) -> None:
        self.last_heard = time.monotonic()
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
