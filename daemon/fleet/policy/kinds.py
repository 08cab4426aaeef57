"""The fleet's slots by the kind of their GPUs, as its hosts say them in their `accepted` events (`gpu_kind`,
`host_slots`), for the waiting requests' ETAs (daemon/fleet/policy/eta.py): a request that asks for a kind or a GPU's
memory (`FleetRequest.need`) is placed only on slots that serve it. And which waiting requests this host's GPUs serve,
the only ones its dispatcher picks."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from daemon.admission.gpu_kinds import HostGpus, kind_memory, serves
from daemon.fleet.policy.order import FleetJob, FleetRequest


@dataclass(frozen=True)
class SlotKinds:
    """The fleet's slots by kind (None: hosts that said no kind), each host's kind, and each kind's memory (GiB)."""

    slots: Mapping[str | None, int]
    hosts: Mapping[str, str | None]
    memory: Mapping[str, float | None]

    def of_job(self, job: FleetJob) -> str | None:
        return self.hosts.get(job.host)

    def serve(self, request: FleetRequest, kinds: Iterable[str | None]) -> list[str | None]:
        """Those of `kinds` whose slots serve `request`: every one for a request that asks nothing of the kind."""
        need = request.need
        return [
            kind for kind in kinds if need is None or (kind is not None and need.served_by(kind, self.memory.get(kind)))
        ]

    def order(self) -> list[str | None]:
        """The kinds, those that said none first, then by memory: a request that takes any takes the least first."""
        return sorted(self.slots, key=lambda kind: (kind is not None, self.memory.get(kind or "") or 0.0, kind or ""))


def slot_kinds(
    host_slots: Mapping[str, int], host_kinds: Mapping[str, str | None], declared: Mapping[str, float]
) -> SlotKinds | None:
    """The fleet's slots by kind from each host's last `accepted` (its slots, its kind), each kind's memory as the
    operator declared it (`gpu_kinds`) or as its name says; None when no host said a kind (the ETAs take every slot
    as one kind, as they always have)."""
    if not any(host_kinds.get(host) for host in host_slots):
        return None
    slots: dict[str | None, int] = {}
    for host, count in host_slots.items():
        kind = host_kinds.get(host)
        slots[kind] = slots.get(kind, 0) + count
    memory = {kind: kind_memory(kind, declared) for kind in slots if kind is not None}
    return SlotKinds(slots, dict(host_kinds), memory)


def servable(waiting: Iterable[FleetRequest], host: HostGpus) -> list[FleetRequest]:
    """The waiting requests this host's GPUs serve: the only ones its dispatcher may claim (or preempt for). Another
    is left where it waits, for a host that serves it, and holds up none behind it."""
    return [request for request in waiting if serves(host, request.need)]
