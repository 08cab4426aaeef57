"""Run one accepted request to its terminal event: child process, then push, then `succeeded` or `failed`.

Every event of the job is published (and acknowledged) before the next step; the terminal event is
returned so the caller can commit the request's offset.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import time
from typing import Any

import structlog

from daemon import hub_push
from daemon.child import ChildOutcome, Message, WarmChildren
from daemon.errors import JobFailed
from daemon.job_spec import JobSpec
from daemon.publisher import Publisher
from daemon.settings import Settings
from schemas.events import EventBase, Failed, Progress, Started, Succeeded
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
    """One request's job. `run()` returns the published terminal event."""

    def __init__(self, request: RequestBase, settings: Settings, publisher: Publisher, children: WarmChildren, received_at: float) -> None:
        self.request = request
        self.settings = settings
        self.publisher = publisher
        self.children = children
        self.received_at = received_at  # wall-clock time the request reached Kafka
        self.job_dir = settings.jobs_dir / request.request_id
        self.log = log.bind(request_id=request.request_id, method=request.method)

    def _common(self) -> dict[str, Any]:
        return {"request_id": self.request.request_id, "metadata": self.request.metadata, "host": self.settings.host}

    async def run(self) -> EventBase:
        started = time.monotonic()
        queued_s = max(0.0, time.time() - self.received_at)
        try:
            outcome = await self._train()
            failure = failure_of(outcome)
            if failure is not None:
                raise failure
            assert outcome.result is not None
            push_started = time.monotonic()
            pushed = await self._push(outcome.result)
            durations = {
                "queue": round(queued_s, 3),
                **outcome.result["durations_s"],
                "push": round(time.monotonic() - push_started, 3),
                "total": round(time.monotonic() - started + queued_s, 3),
            }
            if outcome.first_step_at is not None:
                durations["until_first_step"] = round(outcome.first_step_at - self.received_at, 3)
            event: EventBase = self._succeeded(outcome.result, pushed, durations)
        except JobFailed as failure:
            self.log.warning("job.failed", code=failure.code, stage=failure.stage, error=failure.message)
            event = Failed(**self._common(), code=failure.code, message=failure.message, stage=failure.stage, retryable=failure.retryable)
        await self.publisher.publish(event)
        return event

    async def _train(self) -> ChildOutcome:
        self.job_dir.mkdir(parents=True, exist_ok=True)
        spec = JobSpec(
            request=self.request.model_dump(mode="json"),
            checkpoints=self.job_dir / "checkpoints",
            artifact=self.job_dir / "artifact",
            progress_interval_s=self.settings.progress_interval_s,
        )
        spec_path = self.job_dir / "spec.json"
        spec_path.write_text(spec.model_dump_json(indent=2))
        shutil.rmtree(spec.artifact, ignore_errors=True)  # a half-written artifact from an earlier attempt

        async def on_start(pid: int) -> None:
            self.log.info("job.started", pid=pid)
            await self.publisher.publish(Started(**self._common(), method=self.request.method, slot="all", pid=pid))

        async def on_message(message: Message) -> None:
            if message["kind"] == "progress":
                fields = {k: v for k, v in message.items() if k != "kind"}
                await self.publisher.publish(Progress(**self._common(), **fields))
            elif message["kind"] == "stage":
                self.log.info("job.stage", stage=message["stage"])

        child = await self.children.take()
        return await child.run(spec_path, self.job_dir / "child.log", on_start, on_message)

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
