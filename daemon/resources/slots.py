"""The host's job slots: one per GPU, or `job_slots` CPU slots on a host without GPUs.

A job takes as many slots as its request's `resources.gpus`, the lowest free ids first, and its
child sees only those GPUs (CUDA_VISIBLE_DEVICES). The lowest-first rule lets the daemon start a
warm child for exactly the slot the next single-GPU job will get.

Packing (`Packing`, off unless the operator sets `max_jobs_per_gpu` above 1): a one-GPU job whose
memory estimate is known shares a GPU with others while their shares fit in the GPU's memory less
the headroom, at most `max_jobs_per_gpu` jobs on it; it goes to the fullest GPU it fits on (the
lowest id among equals), so whole GPUs stay free for the jobs that need them. Its child is held to
its share (`Placement.fraction`, torch's per-process memory fraction). A job without an estimate,
one that needs more than a GPU, one sent back to run alone and every multi-GPU job take whole GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import structlog

from daemon.admission.gpu_kinds import HostGpus
from daemon.ops import metrics
from daemon.resources.kinds import host_gpus
from daemon.resources.nvidia_smi import query_gpus
from daemon.settings import Settings

log = structlog.get_logger()

REMOTE = "ray"  # the names of the slots of jobs on the Ray cluster: ray0, ray1...


def discover_gpus(configured: list[str] | None, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPU ids jobs may use: the configured list, else $CUDA_VISIBLE_DEVICES, else what nvidia-smi lists."""
    if configured is not None:
        return list(configured)
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip() and gpu.strip() != "-1"]
    return query_gpus("index", environ) or []


def discover_gpu_memory(environ: Mapping[str, str] = os.environ) -> int | None:
    """The smallest GPU's memory in bytes, as nvidia-smi reports it; None without one."""
    listed = query_gpus("memory.total", environ)
    try:
        return min(int(float(line)) for line in listed) * 2**20 if listed else None  # MiB
    except ValueError as exc:
        log.warning("gpus.discovery_failed", field="memory.total", error=str(exc))
        return None


@dataclass(frozen=True)
class Packing:
    """How full a GPU may be packed: its memory (bytes), the share of it kept free of jobs (the CUDA
    context, fragmentation), and the most jobs on it at once."""

    memory_bytes: int
    headroom: float
    max_jobs: int

    @property
    def usable(self) -> int:
        return int(self.memory_bytes * (1 - self.headroom))


@dataclass(frozen=True)
class Placement:
    """Where a job runs: its slots, and on a shared GPU its share of the memory (None: whole GPUs)."""

    slots: list[str]
    share_bytes: int | None = None
    fraction: float | None = None  # share_bytes of the GPU's memory, for torch.cuda.set_per_process_memory_fraction


def packing_from(settings: Settings) -> Packing | None:
    """The GPUs' memory as the operator packs them (max_jobs_per_gpu; 1: a whole GPU each), when
    known; else None. Known, it also plans every job's memory (daemon/resources/shards.py: a whole copy
    or sharded, or rejected when it fits neither way) whether or not GPUs are packed."""
    memory = settings.gpu_memory_bytes or discover_gpu_memory()
    if memory is None:
        if settings.max_jobs_per_gpu > 1 or settings.gradient_checkpointing_when_needed:  # asked for, and off: said
            log.warning("gpus.packing_off", reason="the GPUs' memory is unknown (gpu_memory_bytes, nvidia-smi)")
        return None
    return Packing(memory, settings.gpu_memory_headroom, settings.max_jobs_per_gpu)


class Slots:
    def __init__(
        self,
        gpus: list[str],
        cpu_slots: int,
        packing: Packing | None = None,
        kind: HostGpus | None = None,
        remote_jobs: int = 0,
    ) -> None:
        self.gpus = gpus
        # Their kind and memory, as requests' resources.gpu_kind and min_gpu_memory_gib read them (`kinds.host_gpus`).
        self.kind = kind if kind is not None else HostGpus(has_gpus=bool(gpus))
        # A whole GPU's memory for jobs (less the headroom), when known: what a job on one may use (its memory plan).
        self.gpu_room = packing.usable if gpus and packing is not None else None
        self.packing = packing if gpus and packing is not None and packing.max_jobs > 1 else None
        self._all = list(gpus) if gpus else [f"cpu{i}" for i in range(cpu_slots)]
        self._jobs: dict[str, list[int | None]] = {
            slot: [] for slot in self._all
        }  # each job's share on it; None: the whole slot
        # The Ray jobs this host supervises (`ray.max_jobs`): slots of none of its GPUs, so a job bigger than the host
        # never takes the ones its own jobs run on. Not among `names`, `free` or `busy`, which are this host's.
        self._remote: dict[str, bool] = {f"{REMOTE}{i}": False for i in range(remote_jobs)}

    @property
    def total(self) -> int:
        return len(self._all)

    @property
    def names(self) -> list[str]:
        """Every slot's name: the GPU ids, or cpu0, cpu1... on a host without GPUs."""
        return list(self._all)

    @property
    def busy(self) -> int:
        """Slots with at least one job."""
        return sum(1 for jobs in self._jobs.values() if jobs)

    @property
    def free(self) -> list[str]:
        """Slots that can take one more job (with packing, a shared GPU with room for another)."""
        most = self.packing.max_jobs if self.packing is not None else 1
        return [slot for slot in self._all if None not in self._jobs[slot] and len(self._jobs[slot]) < most]

    def most_per_job(self) -> int:
        """The most GPUs one job can have here; a host without GPUs runs one-GPU requests on the CPU."""
        return max(1, len(self.gpus))

    def jobs_on(self, slot: str) -> int:
        return len(self._jobs[slot])

    def reserved(self, slot: str) -> int:
        """The memory the jobs on a shared GPU hold as their shares."""
        return sum(share or 0 for share in self._jobs[slot])

    def take(self, count: int, need_bytes: int | None = None) -> Placement | None:
        """A placement for a job of `count` slots needing `need_bytes` on one GPU (None: unknown, or
        to run alone), or None when it does not fit now."""
        packing = self.packing
        # A need of no bytes or fewer is no estimate (daemon/resources/memory.py refuses such headers): a whole GPU.
        if packing is not None and count == 1 and need_bytes is not None and 0 < need_bytes <= packing.usable:
            fits = [slot for slot in self.free if packing.usable - self.reserved(slot) >= need_bytes]
            if not fits:
                return None
            slot = min(
                fits, key=lambda s: (packing.usable - self.reserved(s), self._all.index(s))
            )  # the fullest it fits on
            self._jobs[slot].append(need_bytes)
            return Placement([slot], need_bytes, round(need_bytes / packing.memory_bytes, 4))
        empty = [slot for slot in self._all if not self._jobs[slot]]
        if count > len(empty):
            return None
        taken = empty[:count]
        for slot in taken:
            self._jobs[slot].append(None)
        return Placement(taken)

    def give_back(self, placement: Placement) -> None:
        for slot in placement.slots:
            if slot in self._remote:
                self._remote[slot] = False
            else:
                self._jobs[slot].remove(placement.share_bytes)

    def take_remote(self) -> Placement | None:
        """A slot for a job run on the Ray cluster, or None when this host supervises as many as it may."""
        slot = next((slot for slot, taken in self._remote.items() if not taken), None)
        if slot is None:
            return None
        self._remote[slot] = True
        return Placement([slot])

    @property
    def remote_free(self) -> bool:
        return self.remote_free_count > 0

    @property
    def remote_free_count(self) -> int:
        return sum(1 for taken in self._remote.values() if not taken)

    def is_remote(self, placement: Placement) -> bool:
        return any(slot in self._remote for slot in placement.slots)

    def by_gpu(self) -> dict[str, tuple[int, int]]:
        """Each GPU's jobs and the memory their shares hold (for metrics and `adapterd status`)."""
        return {slot: (len(self._jobs[slot]), self.reserved(slot)) for slot in self.gpus}

    def count(self) -> None:
        """The slots' gauges set to now: slots in use, and each GPU's jobs and the memory their shares hold."""
        metrics.SLOTS_BUSY.set(self.busy)
        for gpu, (jobs, reserved) in self.by_gpu().items():
            metrics.GPU_JOBS.labels(gpu).set(jobs)
            metrics.GPU_MEMORY_RESERVED.labels(gpu).set(reserved)

    def visible_devices(self, slots: list[str]) -> str | None:
        """The CUDA_VISIBLE_DEVICES of a child on these slots; None on CPU slots (the environment is left alone)."""
        return ",".join(slots) if self.gpus else None

    def label(self, slots: list[str]) -> str:
        return ",".join(slots) if self.gpus else "cpu"


def slots_of(settings: Settings) -> Slots:
    """This host's slots as its settings and nvidia-smi say them: its GPUs, their packing and their kind; and the Ray
    jobs it may supervise (`ray.max_jobs`)."""
    gpus = discover_gpus(settings.gpus)
    remote = settings.ray.max_jobs if settings.ray is not None else 0
    return Slots(gpus, settings.job_slots, packing_from(settings), host_gpus(settings, gpus), remote)
