"""Children started ahead of time: one per free slot, its imports done, for the next job.

A warm child has already spent the seconds of importing torch, transformers and TRL when a request
arrives; CUDA stays untouched until its job. Each is replaced after its job, so every job still
gets a clean process of its own.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping
from pathlib import Path

import structlog

from daemon.child import Child
from daemon.settings import Settings

log = structlog.get_logger()


def child_environment(settings: Settings) -> dict[str, str]:
    """What every child sees: the Hub endpoint and the daemon's token (never a request's), quiet logs."""
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


class WarmChildren:
    """Keeps a child started ahead of time for each free slot, and replaces each one a job takes.

    A child is warmed for one slot: CUDA reads CUDA_VISIBLE_DEVICES once, when the child first
    touches CUDA, so the slot's devices are in its environment from the start.
    """

    def __init__(self, env: Mapping[str, str], log_path: Path, enabled: bool) -> None:
        self.env = env
        self.log_path = log_path
        self.enabled = enabled
        self._ready: list[tuple[str | None, Child]] = []  # (CUDA_VISIBLE_DEVICES, child)

    def environment(self, visible_devices: str | None) -> dict[str, str]:
        env = dict(self.env)
        if visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices
        return env

    async def prepare(self, wanted: list[str | None]) -> None:
        """Have one live warm child per entry of `wanted` (the devices of each free slot)."""
        if not self.enabled:
            return
        self._ready = [(devices, child) for devices, child in self._ready if child.process.returncode is None]
        missing = list(wanted)
        for devices, _ in self._ready:
            if devices in missing:
                missing.remove(devices)
        for devices in missing:
            child = await Child.spawn(self.environment(devices), self.log_path)
            self._ready.append((devices, child))
            log.info("child.warming", pid=child.process.pid, visible_devices=devices)
            child.ready_task.add_done_callback(
                lambda task, pid=child.process.pid: log.info(
                    "child.warm_ready" if not task.cancelled() and task.result() else "child.warm_died", pid=pid
                )
            )

    async def take(self, visible_devices: str | None) -> Child:
        """A live warm child for these devices (ready or still importing), else a new cold one."""
        for entry in self._ready:
            devices, child = entry
            if devices == visible_devices and child.process.returncode is None:
                self._ready.remove(entry)
                return child
        return await Child.spawn(self.environment(visible_devices), self.log_path)

    async def close(self) -> None:
        await asyncio.gather(*(child.stop(grace_s=2.0) for _, child in self._ready))
        self._ready = []
