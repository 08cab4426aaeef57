"""Whether a request's GPU needs (`resources.gpu_kind`, `resources.min_gpu_memory_gib`: `GpuNeed`) can be served:
by any kind of the fleet the operator declared (`gpu_kinds`: a pure check, the same on every host and in the queue),
and, on a fleet without priority classes, by this host's GPUs (`HostGpus`: their kind, made by
daemon/resources/kinds.py from nvidia-smi or named by the operator), for it runs whatever its partitions hold. Each
refusal names the field.

With priority classes a host claims only the requests its GPUs serve (daemon/fleet/dispatcher.py), so a request this
host cannot serve is left in its queue for one that can, not refused here.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from daemon.settings import Settings
from schemas import FieldError, Rejection, RequestBase

KIND_FIELD = "resources.gpu_kind"
MEMORY_FIELD = "resources.min_gpu_memory_gib"
_SIZE_OF_KIND = re.compile(r"-(\d+(?:\.\d+)?)gb$")


@dataclass(frozen=True)
class HostGpus:
    """This host's GPUs as a request's needs see them: their kind and each one's memory in GiB (None: no GPU, or not
    known)."""

    kind: str | None = None
    memory_gib: float | None = None
    has_gpus: bool = False

    def said(self) -> str:
        """For a message and `adapterd doctor`."""
        if not self.has_gpus:
            return "no GPU"
        memory = "memory unknown" if self.memory_gib is None else f"{self.memory_gib:g} GiB each"
        return f"{self.kind or 'kind unknown (set gpu_kind)'}, {memory}"


def kind_memory(kind: str, declared: Mapping[str, float]) -> float | None:
    """A kind's memory per GPU in GiB: the operator's figure (`gpu_kinds`), else the one in its name ('-80gb')."""
    if kind in declared:
        return declared[kind]
    size = _SIZE_OF_KIND.search(kind)
    return float(size.group(1)) if size else None


@dataclass(frozen=True)
class GpuNeed:
    """What a request asks of the GPUs it runs on: one of `kinds` (None: any) with at least `min_memory_gib`."""

    kinds: tuple[str, ...] | None = None
    min_memory_gib: float | None = None

    @classmethod
    def of(cls, resources: Any) -> GpuNeed | None:
        """A request's `resources` as a need; None when it asks nothing of the kind."""
        if resources.gpu_kinds is None and resources.min_gpu_memory_gib is None:
            return None
        return cls(resources.gpu_kinds, resources.min_gpu_memory_gib)

    def served_by(self, kind: str | None, memory_gib: float | None) -> bool:
        """Whether a GPU of `kind` with `memory_gib` serves it (an unknown kind or memory serves no need of it)."""
        if self.kinds is not None and kind not in self.kinds:
            return False
        return self.min_memory_gib is None or (memory_gib is not None and memory_gib >= self.min_memory_gib)


def serves(host: HostGpus, need: GpuNeed | None) -> bool:
    """Whether this host's GPUs serve `need` (None: anything does)."""
    return need is None or (host.has_gpus and need.served_by(host.kind, host.memory_gib))


def fleet_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    """Why no kind the operator declared serves the request (none declared: nothing is known, nothing refused)."""
    need = GpuNeed.of(request.resources)
    declared = settings.gpu_kinds
    if need is None or not declared:
        return []
    kinds = {kind: kind_memory(kind, declared) for kind in declared}
    if any(need.served_by(kind, memory) for kind, memory in kinds.items()):
        return []
    fleet = ", ".join(f"{kind} ({memory:g} GiB)" for kind, memory in sorted(kinds.items()) if memory is not None)
    accepted = [kind for kind in kinds if need.kinds is None or kind in need.kinds]
    if not accepted:
        asked = ", ".join(need.kinds or ())
        return [FieldError(path=KIND_FIELD, message=f"{asked}: no GPU of this fleet is of that kind; it has {fleet}")]
    largest = max(accepted, key=lambda kind: kinds[kind] or 0.0)
    return [
        FieldError(
            path=MEMORY_FIELD,
            message=(
                f"asks for {need.min_memory_gib:g} GiB a GPU; the most of the fleet's kinds it accepts is "
                f"{kinds[largest] or 0:g} GiB ({largest}); the fleet has {fleet}"
            ),
        )
    ]


def fleet_rejection(request: RequestBase | None, settings: Settings) -> Rejection | None:
    """A request in a class's queue that no declared kind serves, rejected where it waits (daemon/fleet/choice.py):
    no host would ever claim it."""
    errors = fleet_errors(request, settings) if request is not None else []
    return Rejection("resources", errors, request.request_id) if request is not None and errors else None


def host_errors(request: RequestBase, settings: Settings, host: HostGpus) -> list[FieldError]:
    """Why this host, on a fleet without priority classes, will not run a request its GPUs do not serve: it runs what
    its partitions hold, and no other host would be given it. With classes: none (it is left for a host that serves
    it)."""
    need = GpuNeed.of(request.resources)
    if need is None or settings.priority_classes or serves(host, need):
        return []
    path = KIND_FIELD if need.kinds is not None and host.kind not in need.kinds else MEMORY_FIELD
    return [
        FieldError(
            path=path,
            message=(
                f"not served by this host ({host.said()}), and without priority classes a request runs on the host "
                "that reads its partition; a fleet of several kinds needs priority_classes, so that a host that "
                "serves it claims it (deploy/README.md)"
            ),
        )
    ]


def kind_errors(request: RequestBase, settings: Settings, host: HostGpus) -> list[FieldError]:
    """`fleet_errors`, else `host_errors`."""
    return fleet_errors(request, settings) or host_errors(request, settings, host)
