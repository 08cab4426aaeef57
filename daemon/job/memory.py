"""A job's memory, beside its lifecycle: the speed settings the host gives its child (gradient
checkpointing off only where the job's estimate without it fits a whole GPU), and the memory its
`succeeded` event reports, from whose GPU peak the estimator learns: only where the job ran with the
activation checkpointing its estimate assumed (`ran_as_estimated`), so one request's own settings
teach the history nothing."""

from __future__ import annotations

from structlog.typing import FilteringBoundLogger

from daemon.ops.metrics import JOB_MEMORY_PEAK, JOB_MEMORY_RATIO
from daemon.resources.estimator import Estimator
from daemon.resources.memory import Estimate
from daemon.resources.shards import shards
from daemon.resources.slots import Placement
from daemon.settings import Settings
from handlers.protocol import FastSettings, MemoryUse
from schemas.events import JobMemory
from schemas.request import RequestBase


async def fast_settings(
    request: RequestBase,
    settings: Settings,
    share: Placement | None,
    gpu_room: int | None,
    memory: Estimator | None,
    log: FilteringBoundLogger,
) -> FastSettings:
    """The host's speed settings for this job (the child applies each only where the request is
    silent). Gradient checkpointing goes off only for a job on a whole GPU whose estimate without
    it fits that GPU (one GPU's figure under its plan, sharded or whole); on a shared GPU its share was reckoned
    with it, and unknown stays TRL's."""
    checkpointing = None
    if settings.gradient_checkpointing_when_needed and share is None and gpu_room is not None and memory is not None:
        lean = await memory.need(
            request, gradient_checkpointing=False, shards=shards(request)
        )  # one GPU's figure under its plan
        if lean is not None:
            checkpointing = lean.needed > gpu_room
            log.info("job.checkpointing", needed=checkpointing, estimate_without=lean.needed, gpu_room=gpu_room)
    return FastSettings(
        gradient_checkpointing=checkpointing,
        attn_implementation="flash_attention_2" if settings.fastest_attention else None,
        use_liger_kernel=True if settings.liger_kernel else None,
    )


def ran_as_estimated(request: RequestBase, estimate: Estimate, fast: FastSettings | None) -> bool:
    """Whether the job ran with the activation checkpointing its estimate assumed: the request's own setting,
    else the host's (`fast`), else TRL's default (on). Only then is its measured/estimated ratio a correction of the
    model of memory, for every job of its model and method: the history scales later estimates by the largest ratio,
    and one request with `activation_checkpointing: false` (twice its estimate) kept 2 of 4 honest jobs off a GPU
    they fit. Checkpointing kwargs (every_n_layers, offload) change memory the estimate does not model: not learnt;
    nor a job whose host settings are unknown (a result read back from an earlier attempt's journal)."""
    training = request.training
    if training.activation_checkpointing_kwargs is not None or training.gradient_checkpointing_kwargs is not None:
        return False
    said = (
        training.activation_checkpointing
        if training.activation_checkpointing is not None
        else training.gradient_checkpointing  # TRL's deprecated alias
    )
    if said is None:
        if fast is None:
            return False
        said = True if fast.gradient_checkpointing is None else fast.gradient_checkpointing
    return bool(said) == estimate.gradient_checkpointing


def reported_memory(
    request: RequestBase,
    estimate: Estimate | None,
    share: Placement | None,
    measured: MemoryUse | None,
    memory: Estimator | None,
    fast: FastSettings | None = None,
) -> JobMemory:
    """Its memory for `succeeded`: the estimate and share it started with, and what its child
    measured; a GPU's allocator peak is kept for the next estimates of its model and method when it ran
    as estimated (`ran_as_estimated`, with `fast`, the host's speed settings it ran with)."""
    if measured is not None:
        JOB_MEMORY_PEAK.labels(request.method).observe(measured.peak_allocated_bytes or measured.device_peak_bytes)
        if measured.device == "cuda" and measured.peak_allocated_bytes and estimate is not None and estimate.total > 0:
            JOB_MEMORY_RATIO.labels(request.method).observe(measured.peak_allocated_bytes / estimate.total)
            # Only a one-GPU job's peak teaches the history: a job of several reports one rank's, and a sharded one's
            # error is not a whole copy's (its ratio would scale every whole-copy estimate of the model).
            if memory is not None and request.resources.gpus == 1 and ran_as_estimated(request, estimate, fast):
                memory.learn(request, estimate, measured.peak_allocated_bytes)
    return JobMemory(
        estimate_bytes=estimate.needed if estimate is not None else None,
        share_bytes=share.share_bytes if share is not None else None,
        device=measured.device if measured is not None else None,
        peak_allocated_bytes=measured.peak_allocated_bytes if measured is not None else None,
        device_peak_bytes=measured.device_peak_bytes if measured is not None else None,
    )
