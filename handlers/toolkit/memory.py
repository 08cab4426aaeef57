"""The child's memory: its share of a shared GPU (`JobSpec.memory_fraction`), the most memory its job
took (`TrainResult.memory`), and CUDA running out of it (`out_of_memory`, a retried failure of its own).
"""

from __future__ import annotations

import resource

import torch

from handlers.protocol import JobFailed, MemoryUse

# What torch says when the caching allocator cannot get the bytes it asks for (in OutOfMemoryError's
# message, and in a RuntimeError some libraries raise in its place).
CUDA_OOM_TEXT = "CUDA out of memory"


def device_memory_used(device: torch.device) -> int:
    """The bytes the device reports used, by every process on it: NVML's figure where torch has it
    (`torch.cuda.device_memory_used`, needs pynvml), else the driver's (total − free, `mem_get_info`)."""
    try:
        return int(torch.cuda.device_memory_used(device))
    except Exception:  # no pynvml (or no NVML on this host): the driver's own figure
        free, total = torch.cuda.mem_get_info(device)
        return int(total - free)


def peak_rss_bytes() -> int:
    """The process's peak resident set: `ru_maxrss`, in KiB on Linux."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class MemoryWatch:
    """The most memory a job takes, from CUDA's start (handlers/toolkit/reporting.py `start_cuda`) to its result.

    On CUDA: torch's allocator peaks (`max_memory_allocated`, `max_memory_reserved`, counted from
    `reset_peak_memory_stats` at the start) and the device's own figure (`device_memory_used`), which
    only a sample sees: `sample` is called where the child already reports (each heartbeat, progress,
    stage and checkpoint message, `StatusReporter.send`), so a peak between two samples may be missed,
    and the figure counts every process on the device, a neighbour's memory too. On the CPU (CUDA
    never started): the process's peak resident set.
    """

    def __init__(self) -> None:
        self.device: torch.device | None = None  # set once the job's CUDA starts
        self.device_peak = 0

    def start(self, device: torch.device, fraction: float | None) -> None:
        """Before the job's first CUDA allocation: its share of the GPU (so one job's growth fails that
        job, not its neighbours on a shared GPU), and the allocator's peaks counted from here."""
        if fraction is not None:
            torch.cuda.set_per_process_memory_fraction(fraction, device)
        torch.cuda.reset_peak_memory_stats(device)
        self.device = device
        self.sample()

    def sample(self) -> None:
        """Never raises: it runs on every message the child sends, its error report too (after a CUDA
        error the device may answer nothing), and a sample missed is only a peak maybe missed."""
        if self.device is None:
            return
        try:
            self.device_peak = max(self.device_peak, device_memory_used(self.device))
        except Exception:
            pass

    def use(self) -> MemoryUse:
        if self.device is None:
            return MemoryUse(
                device="cpu", peak_allocated_bytes=None, peak_reserved_bytes=None, device_peak_bytes=peak_rss_bytes()
            )
        self.sample()
        return MemoryUse(
            device="cuda",
            peak_allocated_bytes=int(torch.cuda.max_memory_allocated(self.device)),
            peak_reserved_bytes=int(torch.cuda.max_memory_reserved(self.device)),
            device_peak_bytes=self.device_peak,
        )


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or an error saying so in its message (or raised from one)."""
    while exc is not None:
        if isinstance(exc, torch.cuda.OutOfMemoryError) or CUDA_OOM_TEXT in str(exc):
            return True
        exc = exc.__cause__  # type: ignore[assignment]
    return False


def out_of_memory(exc: BaseException, stage: str, fraction: float | None) -> JobFailed | None:
    """The job's failure when `exc` is CUDA out of memory, in `stage`: retried (another attempt may find
    the GPU freer), its message naming the job's share of the GPU when it had one; None for any other error."""
    if not is_out_of_memory(exc):
        return None
    share = (
        f" within this job's share of its GPU (memory_fraction {fraction:g}, {fraction:.0%})"
        if fraction is not None
        else ""
    )
    return JobFailed(
        "out_of_memory",
        stage,
        f"CUDA out of memory in stage {stage}{share}: {type(exc).__name__}: {exc}",
        retryable=True,
    )
