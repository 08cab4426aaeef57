"""Run one accepted request to its terminal event: child process, then push, then `succeeded` or `failed`.

Every event of the job is published (and acknowledged) before the next step; the terminal event is
returned so the caller can commit the request's offset.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import time
from typing import Any

import structlog

from daemon import hub_push
from daemon.child import Child, ChildOutcome, Message, WarmChildren
from schemas.job import JobFailed, JobSpec
from daemon.journal import Journal
from daemon.metrics import JOBS, STAGE_SECONDS
from daemon.policy import report_to
from daemon.publisher import Publisher
from daemon.settings import Settings
from schemas.events import (
    STAGES,
    Cancelled,
    Checkpoint,
    EventBase,
    Failed,
    Progress,
    Retrying,
    Stage,
    Started,
    Succeeded,
)
from schemas.request import RequestBase

log = structlog.get_logger()


def child_environment(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["HF_ENDPOINT"] = settings.hub_endpoint
    env.pop("HF_TOKEN", None)
    if settings.hub_token is not None:
        env["HF_TOKEN"] = settings.hub_token.get_secret_value()
    # The child's own logs go to a file: keep them free of progress bars.
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _timeout(requested: int | None, most: int | None) -> int | None:
    """The job's wall-clock limit: what the request asked for, capped by the operator's maximum."""
    if requested is None:
        return most
    return requested if most is None else min(requested, most)


def _stage(stage: str) -> Stage:
    return stage if stage in STAGES else "train"  # type: ignore[return-value]


def failure_of(outcome: ChildOutcome) -> JobFailed | None:
    """The child's own account of its failure, or one derived from how it died."""
    if outcome.error is not None:
        error = outcome.error
        return JobFailed(error["code"], error["stage"], error["message"], retryable=error["retryable"])
    if outcome.returncode != 0 or outcome.result is None:
        tail = " | ".join(line.strip() for line in outcome.log_tail[-5:] if line.strip())
        return JobFailed(
            "child_crashed", outcome.stage,
            f"the training process died ({outcome.describe_exit()}) during {outcome.stage}; last output: {tail or '(none)'}",
            retryable=True,
        )
    return None


class JobRunner:
    """One request's job on its slots. `run()` returns the published terminal event.

    Cancelling the task that awaits `run()` stops the child's process group. After `cancel()` the
    job ends in `cancelled`; otherwise (the daemon stops, the partition moved) it ends with no
    terminal event, so the request is read again.
    """

    def __init__(
        self, request: RequestBase, settings: Settings, publisher: Publisher, children: WarmChildren,
        received_at: float, slot: str, visible_devices: str | None, attempt: int = 1,
    ) -> None:
        self.request = request
        self.settings = settings
        self.publisher = publisher
        self.children = children
        self.received_at = received_at  # wall-clock time the request reached Kafka
        self.slot = slot
        self.visible_devices = visible_devices
        self.gpus = request.resources.gpus
        self.attempt = attempt
        self.job_dir = settings.jobs_dir / request.request_id
        self.journal = Journal(self.job_dir / "journal.json")
        self.log = log.bind(request_id=request.request_id, method=request.method, slot=slot)
        self.timeout_s = _timeout(request.timeout_s, settings.max_timeout_s)
        self.stage = "queued"
        self.progress: dict[str, Any] = {}
        self.child: Child | None = None
        self.stop_grace_s = 0.0  # a cancel or timeout kills the child at once; a daemon stop lets it checkpoint
        self.cancel_reason: str | None = None
        self.last_heard = time.monotonic()  # the last message from the child, for the stall watchdog
        self.stalled = False
        self.ended = False  # its terminal (or retrying) event is published: only the commit is left

    def _common(self) -> dict[str, Any]:
        return {"request_id": self.request.request_id, "metadata": self.request.metadata, "host": self.settings.host, "attempt": self.attempt}

    def stop_at_checkpoint(self, grace_s: float) -> None:
        """Before the task is cancelled for a daemon stop: give the child `grace_s` to save a checkpoint."""
        self.stop_grace_s = grace_s
        if self.child is not None:
            self.child.stop_grace_s = grace_s

    def cancel(self, reason: str) -> bool:
        """Before the task is cancelled for a cancel request. False once the push has begun: too late."""
        if self.stage == "push":
            return False
        self.cancel_reason = reason
        return True

    def status(self) -> dict[str, Any]:
        return {
            "request_id": self.request.request_id, "method": self.request.method, "slot": self.slot,
            "stage": self.stage, "pid": self.child.process.pid if self.child else None, **self.progress,
        }

    async def run(self) -> EventBase:
        started = time.monotonic()
        queued_s = max(0.0, time.time() - self.received_at)
        event: EventBase | None
        try:
            if self.attempt > 1:
                backoff_s = min(self.settings.retry_backoff_s * 2 ** (self.attempt - 2), 3600.0)
                self.log.info("job.retry_backoff", attempt=self.attempt, seconds=backoff_s)
                await asyncio.sleep(backoff_s)
            event = await self._earlier_success()
            if event is None:
                result, first_step_at = await self._trained()
                self.stage = "push"
                push_started = time.monotonic()
                pushed = await self._push(result)
                durations = {
                    "queue": round(queued_s, 3),
                    **result["durations_s"],
                    "push": round(time.monotonic() - push_started, 3),
                    "total": round(time.monotonic() - started + queued_s, 3),
                }
                if first_step_at is not None:
                    durations["until_first_step"] = round(first_step_at - self.received_at, 3)
                for stage, seconds in durations.items():
                    STAGE_SECONDS.labels(stage).observe(seconds)
                event = self._succeeded(result, pushed, durations)
                self.journal.record("succeeded", event.model_dump(mode="json"))
        except JobFailed as failure:
            self.log.warning("job.failed", code=failure.code, stage=failure.stage, error=failure.message, attempt=self.attempt)
            if failure.retryable and self.attempt < self.settings.max_attempts:
                event = Retrying(**self._common(), code=failure.code, message=failure.message, stage=failure.stage,
                                 max_attempts=self.settings.max_attempts)
            else:
                event = Failed(**self._common(), code=failure.code, message=failure.message, stage=failure.stage, retryable=failure.retryable)
        except asyncio.CancelledError:
            if self.cancel_reason is None:
                raise
            current = asyncio.current_task()
            assert current is not None
            current.uncancel()
            self.log.info("job.cancelled", reason=self.cancel_reason)
            event = Cancelled(**self._common(), reason=self.cancel_reason or "cancelled")
        assert event is not None
        await self.publisher.publish(event)
        self.ended = True
        if event.type != "retrying":
            JOBS.labels(event.type).inc()
        return event

    async def _trained(self) -> tuple[Message, float | None]:
        """The child's result, and the time of its first step: an earlier attempt's when its
        artifact is complete on disk (nothing is trained twice), else this attempt's."""
        trained = self.journal.read().get("trained")
        if trained is not None and (self.job_dir / "artifact").is_dir():
            self.log.info("job.already_trained", artifact=str(self.job_dir / "artifact"))
            return trained, None
        outcome = await self._train()
        failure = failure_of(outcome)
        if failure is not None:
            raise failure
        assert outcome.result is not None
        self.journal.record("trained", outcome.result)
        return outcome.result, outcome.first_step_at

    async def _train(self) -> ChildOutcome:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        spec = JobSpec(
            request=self.request.model_dump(mode="json"),
            checkpoints=self.job_dir / "checkpoints",
            artifact=self.job_dir / "artifact",
            progress_interval_s=self.settings.progress_interval_s,
            progress_interval_steps=self.settings.progress_interval_steps,
            report_to=report_to(self.request, self.settings),
            max_dataset_rows=self.settings.max_dataset_rows,
        )
        spec_path = self.job_dir / "spec.json"
        spec_path.write_text(spec.model_dump_json(indent=2))
        self.journal.record("trained", None)  # until this attempt's artifact is complete
        shutil.rmtree(spec.artifact, ignore_errors=True)  # a half-written artifact from an earlier attempt

        async def on_start(pid: int) -> None:
            self.stage = "preflight"
            self.log.info("job.started", pid=pid, visible_devices=self.visible_devices, timeout_s=self.timeout_s)
            await self.publisher.publish(Started(**self._common(), method=self.request.method, slot=self.slot, pid=pid))

        async def on_message(message: Message) -> None:
            self.last_heard = time.monotonic()
            kind = message["kind"]
            if kind == "progress":
                fields = {k: v for k, v in message.items() if k != "kind"}
                self.progress = {"step": fields["step"], "total_steps": fields["total_steps"], "eta_s": fields.get("eta_s")}
                await self.publisher.publish(Progress(**self._common(), **fields))
            elif kind == "checkpoint":
                self.log.info("job.checkpoint", step=message["step"], path=message["path"])
                await self.publisher.publish(Checkpoint(**self._common(), step=message["step"], path=message["path"]))
            elif kind == "stopped":
                self.log.info("job.stopped_at_checkpoint", step=message["step"], path=message["path"])
            elif kind == "stage":
                self.stage = message["stage"]
                self.log.info("job.stage", stage=message["stage"])

        if self.gpus > 1:  # data-parallel: torchrun's agent and one worker per GPU, started for this job
            job = json.dumps({"spec": str(spec_path), "log": str(self.job_dir / "child.log")})
            env = {**self.children.environment(self.visible_devices), "ADAPTERD_JOB": job}
            self.child = child = await Child.spawn(env, self.job_dir / "child.log", entry=("handlers.launch", str(self.gpus)))
        else:
            self.child = child = await self.children.take(self.visible_devices)
        child.stop_grace_s = self.stop_grace_s
        child.log_context = {"request_id": self.request.request_id}
        run = asyncio.create_task(child.run(spec_path, self.job_dir / "child.log", on_start, on_message))
        watchdog = asyncio.create_task(self._watch_for_stalls(run))
        try:
            async with asyncio.timeout(self.timeout_s):
                return await run
        except TimeoutError:
            raise JobFailed(
                "timeout", _stage(self.stage), f"timeout_s: the job ran longer than {self.timeout_s} s and was stopped", retryable=False
            ) from None
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if self.stalled and current is not None and current.cancelling() == 0:
                raise JobFailed(
                    "stalled", "train", f"no training step for {self.settings.stall_timeout_s} s (stall_timeout_s); the job was stopped",
                    retryable=True,
                ) from None
            raise
        finally:
            watchdog.cancel()
            if not run.done():
                run.cancel()  # stops the child's process group
            await asyncio.gather(run, return_exceptions=True)

    async def _watch_for_stalls(self, run: asyncio.Task[ChildOutcome]) -> None:
        """Stop a training job that goes `stall_timeout_s` without a step (a hung collective, a stuck
        data loader): while it trains, the child says something every few seconds."""
        limit = self.settings.stall_timeout_s
        if limit is None:
            return
        while not run.done():
            await asyncio.sleep(min(limit / 4, 5.0))
            if self.stage == "train" and time.monotonic() - self.last_heard > limit:
                self.log.warning("job.stalled", silent_s=round(time.monotonic() - self.last_heard, 1))
                self.stalled = True
                run.cancel()
                return

    async def _earlier_success(self) -> Succeeded | None:
        """This request's `succeeded` again, marked duplicate, when an earlier attempt got that far:
        from this host's journal, or from the Hub commit that records the request id."""
        recorded = self.journal.read().get("succeeded")
        if recorded is not None:
            earlier = Succeeded.model_validate(recorded)
            self.log.info("job.duplicate", commit_sha=earlier.commit_sha, found_in="journal")
            return Succeeded(**{**earlier.model_dump(exclude={"event_id", "time"}), **self._common(), "duplicate": True})
        found = await asyncio.to_thread(hub_push.find_commit, self.request, self.settings)
        if found is None:
            return None
        self.log.info("job.duplicate", commit_sha=found.commit_sha, found_in="hub")
        return Succeeded(
            **self._common(), sink=found.sink, repo_id=found.repo_id, revision=found.revision, commit_sha=found.commit_sha,
            commit_url=found.commit_url, location=found.location, files=found.files, metrics={}, durations_s={},
            versions={}, method=self.request.method, trainer="unknown: found by its Hub commit",
            base_model=self.request.model.id, base_model_revision=None, dataset_fingerprint=None, duplicate=True,
        )

    async def _push(self, result: Message) -> hub_push.PushResult:
        artifact = self.job_dir / "artifact"
        card = hub_push.model_card(self.request, result["trainer"], result["base_model_revision"], result["metrics"], result["versions"])
        (artifact / "README.md").write_text(card)
        pushed = await asyncio.to_thread(hub_push.push, artifact, self.request, self.settings)
        self.log.info("job.pushed", sink=pushed.sink, commit_sha=pushed.commit_sha, location=pushed.location)
        return pushed

    def _succeeded(self, result: Message, pushed: hub_push.PushResult, durations: dict[str, float]) -> Succeeded:
        return Succeeded(
            **self._common(),
            sink=pushed.sink,
            repo_id=pushed.repo_id,
            revision=pushed.revision,
            commit_sha=pushed.commit_sha,
            commit_url=pushed.commit_url,
            location=pushed.location,
            files=pushed.files,
            # JSON has no NaN or infinity; a metric without a finite value is left out, not sent as null.
            metrics={name: value for name, value in result["metrics"].items() if math.isfinite(value)},
            durations_s=durations,
            versions=result["versions"],
            method=self.request.method,
            trainer=result["trainer"],
            base_model=self.request.model.id,
            base_model_revision=result["base_model_revision"],
            dataset_fingerprint=result["dataset_fingerprint"],
        )
