"""What a job's child is told: the spec (`handlers.protocol.JobSpec`) built from the request and the
host's settings, the only way a setting reaches the training process."""

from __future__ import annotations

from pathlib import Path

from daemon.admission.policy import report_to
from daemon.hub.local_sink import local_target
from daemon.settings import Settings
from handlers.protocol import FastSettings, JobSpec, StartPoint
from schemas.request import RequestBase


def job_spec(
    request: RequestBase,
    settings: Settings,
    job_dir: Path,
    traceparent: str | None,
    memory_fraction: float | None = None,
    fast: FastSettings | None = None,
    start: StartPoint | None = None,
) -> JobSpec:
    """The request with the operator's bounds and rules for its child; paths under `job_dir`."""
    return JobSpec(
        request=request.model_dump(mode="json"),
        checkpoints=job_dir / "checkpoints",
        artifact=job_dir / "artifact",
        progress_interval_s=settings.progress_interval_s,
        progress_interval_steps=settings.progress_interval_steps,
        report_to=report_to(request, settings),
        max_dataset_rows=settings.max_dataset_rows,
        max_model_bytes=settings.max_model_bytes,
        max_dataset_bytes=settings.max_dataset_bytes,
        max_template_bytes=settings.max_template_bytes,
        max_template_s=settings.max_template_s,
        allowed_local_dataset_roots=settings.allowed_local_dataset_roots,
        storage_options=settings.dataset_storage_options,
        vllm_server_base_url=settings.vllm_server_base_url,
        allowed_dataset_urls=settings.allowed_dataset_urls,
        images=settings.image_bounds,
        traceparent=traceparent,
        tensorboard_dir=settings.tensorboard_dir,
        hub=settings.hub_token is not None,
        local_current_adapter=_local_current_adapter(request, settings),
        memory_fraction=memory_fraction,
        fast=fast or FastSettings(),
        start=start,
    )


def _local_current_adapter(request: RequestBase, settings: Settings) -> Path | None:
    """For the `current` baseline on a host without a Hub: the adapter the local sink holds at the
    request's target, when there is one (the child reads no other host path for it)."""
    if settings.hub_token is not None or request.evaluation is None or "current" not in request.evaluation.baselines:
        return None
    target = local_target(request, settings)
    return target if (target / "adapter_config.json").is_file() else None
