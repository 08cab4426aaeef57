"""What the scheduler decided for a job, handed to its runner as two frozen values: where it runs
(`JobPlace`: its slots' label, its devices, its share of a shared GPU) and what its memory was planned
with (`MemoryPlan`: its estimate, a whole GPU's room, the estimator that learns from its peak)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from daemon.resources.estimator import Estimator
from daemon.resources.memory import Estimate
from daemon.resources.slots import Placement, Slots


@dataclass(frozen=True)
class JobPlace:
    """Where a job runs: `slot` as `started` names it ("cpu", or its GPUs), the CUDA_VISIBLE_DEVICES of its child
    (None on the CPU: the environment is left alone), and on a GPU shared with other jobs
    its share (None: whole GPUs)."""

    slot: str
    visible_devices: str | None = None
    share: Placement | None = None
    engine: Literal["local", "ray"] = "local"  # this host's slots, or the Ray cluster's (daemon/children/ray_jobs.py)

    @classmethod
    def on(cls, slots: Slots, placement: Placement) -> JobPlace:
        if slots.is_remote(placement):
            return cls("ray", None, None, "ray")
        return cls(
            slots.label(placement.slots),
            slots.visible_devices(placement.slots),
            placement if placement.share_bytes is not None else None,
        )

    @property
    def share_bytes(self) -> int | None:
        return self.share.share_bytes if self.share is not None else None


@dataclass(frozen=True)
class MemoryPlan:
    """A job's memory as planned before it started: its estimate (daemon/resources/memory.py; None unknown), a whole
    GPU's memory for jobs when known (whether it fits without gradient checkpointing), and the estimator its measured
    peak teaches. The default plan knows nothing: a CPU host's, or a job's whose model was not estimated."""

    estimate: Estimate | None = None
    gpu_room: int | None = None
    estimator: Estimator | None = None
