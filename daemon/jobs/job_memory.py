"""A job's memory, beside its lifecycle: the speed settings the host gives its child (gradient
checkpointing off only where the job's estimate without it fits a whole GPU), and the memory its
`succeeded` event reports, from whose GPU peak the estimator learns."""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from daemon.jobs.estimator import Estimator
from daemon.jobs.memory import Estimate
from daemon.jobs.slots import Placement
from daemon.ops.metrics import JOB_MEMORY_PEAK, JOB_MEMORY_RATIO
from daemon.settings import Settings
from handlers.protocol import FastSettings, MemoryUse
from schemas.events import JobMemory
from schemas.request import RequestBase


async def fast_settings(
    request: RequestBase, settings: Settings, share: Placement | None, gpu_room: int | None, memory: Estimator | None,
    log: FilteringBoundLogger,
) -> FastSettings:
    """The host's speed settings for this job (the child applies each only where the request is
    silent). Gradient checkpointing goes off only for a job on a whole GPU whose estimate without
    it fits that GPU; on a shared GPU its share was reckoned with it, and unknown stays TRL's."""
    checkpointing = None
    if settings.gradient_checkpointing_when_needed and share is None and gpu_room is not None and memory is not None:
        lean = await memory.need(request, gradient_checkpointing=False)
        if lean is not None:
            checkpointing = lean.needed > gpu_room
            log.info("job.checkpointing", needed=checkpointing, estimate_without=lean.needed, gpu_room=gpu_room)
    return FastSettings(
        gradient_checkpointing=checkpointing,
        attn_implementation="flash_attention_2" if settings.fastest_attention else None,
        use_liger_kernel=True if settings.liger_kernel else None,
    )


def reported_memory(
    request: RequestBase, estimate: Estimate | None, share: Placement | None, measured: MemoryUse | None, memory: Estimator | None,
) -> JobMemory:
    """Its memory for `succeeded`: the estimate and share it started with, and what its child
    measured; a GPU's allocator peak is kept for the next estimates of its model and method."""
    if measured is not None:
        JOB_MEMORY_PEAK.labels(request.method).observe(measured.peak_allocated_bytes or measured.device_peak_bytes)
        if measured.device == "cuda" and measured.peak_allocated_bytes and estimate is not None and estimate.total > 0:
            JOB_MEMORY_RATIO.labels(request.method).observe(measured.peak_allocated_bytes / estimate.total)
            if memory is not None:
                memory.learn(request, estimate, measured.peak_allocated_bytes)
    return JobMemory(
        estimate_bytes=estimate.needed if estimate is not None else None,
        share_bytes=share.share_bytes if share is not None else None,
        device=measured.device if measured is not None else None,
        peak_allocated_bytes=measured.peak_allocated_bytes if measured is not None else None,
        device_peak_bytes=measured.device_peak_bytes if measured is not None else None,
    )
