"""What a job's child is told: the spec (`schemas.job.JobSpec`) built from the request and the
host's settings, the only way a setting reaches the training process."""

from __future__ import annotations

from pathlib import Path

from daemon.admission.policy import report_to
from daemon.settings import Settings
from schemas.job import JobSpec
from schemas.request import RequestBase


def job_spec(request: RequestBase, settings: Settings, job_dir: Path, traceparent: str | None) -> JobSpec:
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
    )
