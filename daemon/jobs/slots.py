"""The host's job slots: one per GPU, or `job_slots` CPU slots on a host without GPUs.

A job takes as many slots as its request's `resources.gpus`, the lowest free ids first, and its
child sees only those GPUs (CUDA_VISIBLE_DEVICES). The lowest-first rule lets the daemon start a
warm child for exactly the slot the next single-GPU job will get.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping

import structlog

log = structlog.get_logger()


def discover_gpus(configured: list[str] | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPU ids jobs may use: the configured list, else $CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    if configured is not None:
        return list(configured)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip() and gpu.strip() != "-1"]
    nvidia_smi = shutil.which("nvidia-smi")
    if nvidia_smi is None:
        return []
    try:
        listed = subprocess.run(
            [nvidia_smi, "--query-gpu=index", "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("gpus.discovery_failed", error=str(exc))
        return []
    return [line.strip() for line in listed.splitlines() if line.strip()]


class Slots:
    def __init__(self, gpus: list[str], cpu_slots: int) -> None:
        self.gpus = gpus
        self._all = list(gpus) if gpus else [f"cpu{i}" for i in range(cpu_slots)]
        self._free = list(self._all)

    @property
    def total(self) -> int:
        return len(self._all)

    @property
    def busy(self) -> int:
        return len(self._all) - len(self._free)

    @property
    def free(self) -> list[str]:
        return list(self._free)

    def most_per_job(self) -> int:
        """The most GPUs one job can have here; a host without GPUs runs one-GPU requests on the CPU."""
        return max(1, len(self.gpus))

    def take(self, count: int) -> list[str] | None:
        """`count` free slots, lowest first, or None when fewer are free."""
        if count > len(self._free):
            return None
        taken = sorted(self._free, key=self._all.index)[:count]
        self._free = [slot for slot in self._free if slot not in taken]
        return taken

    def give_back(self, slots: list[str]) -> None:
        self._free = sorted({*self._free, *slots}, key=self._all.index)

    def visible_devices(self, slots: list[str]) -> str | None:
        """The CUDA_VISIBLE_DEVICES of a child on these slots; None on CPU slots (the environment is left alone)."""
        return ",".join(slots) if self.gpus else None

    def label(self, slots: list[str]) -> str:
        return ",".join(slots) if self.gpus else "cpu"
