"""A host that holds only requests its GPUs cannot serve leaves their class's queue for a while, when the events say
a host whose GPUs serve one of them has a free slot: the group's rebalance then gives the partitions to the hosts
that stay, among them that one. Without it, such a request waited for as long as hosts that cannot serve it held its
partition and kept room (an idle L4 holding an H100 request's partition), since a host reads a queue while it has
room and a request is seen only by the host that holds its partition.

It leaves for `AWAY_S`, then joins again (a rebalance each way, about a second each: daemon/kafka/clients.py
`HEARTBEAT_MS`); it leaves only while every request it holds of that queue is one it cannot serve, so it goes on
claiming what it serves. Where another host that cannot serve it takes the partition, that host leaves in turn: the
partition reaches a host that serves it, or one that serves it frees a slot, within a few rebalances. The events'
count of free slots is not exact (daemon/fleet/view.py `startable_elsewhere`): a host that left for a slot the events
counted free, and was not, joins again after `AWAY_S`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Mapping, Sequence

import structlog

from daemon.admission.gpu_kinds import HostGpus, kind_memory, serves
from daemon.fleet.policy.order import FleetJob, FleetRequest
from daemon.fleet.queues import ClassQueue
from daemon.fleet.view import FleetView

log = structlog.get_logger()

AWAY_S = 10.0  # long enough for the rebalance and a turn of the host that takes the partition (`TURN_S`)


def free_elsewhere(
    host_slots: Mapping[str, int],
    host_kinds: Mapping[str, str | None],
    running: Sequence[FleetJob],
    me: str,
    declared: Mapping[str, float],
) -> dict[str, float | None]:
    """The kinds (and their memory) of the other hosts that have a free slot, as their last `accepted` events and the
    running jobs say."""
    used: Counter[str] = Counter()
    for job in running:
        used[job.host] += job.gpus
    return {
        kind: kind_memory(kind, declared)
        for host, slots in host_slots.items()
        if host != me and slots > used[host] and (kind := host_kinds.get(host)) is not None
    }


def served_elsewhere(held: Sequence[FleetRequest], here: HostGpus, free: Mapping[str, float | None]) -> bool:
    """Whether none of the requests `held` is served here and one of them is by a kind with a free slot elsewhere."""
    if not held or any(serves(here, request.need) for request in held):
        return False
    return any(
        request.need is not None and any(request.need.served_by(kind, memory) for kind, memory in free.items())
        for request in held
    )


class AwayForKinds:
    """When this host stays out of a class's queue for the kinds of GPU its requests ask for (the module's rule)."""

    def __init__(self, view: FleetView, here: HostGpus) -> None:
        self.view = view
        self.here = here
        self.until: dict[str, float] = {}  # a queue's name → when this host may join it again

    def may_read(self, queue: ClassQueue, now: float | None = None) -> bool:
        """False while this host stays out of `queue`; it starts to when every request it holds there is one it cannot
        serve and a host that serves one of them has a free slot."""
        now = time.time() if now is None else now
        if now < self.until.get(queue.name, 0.0):
            return False
        held = [head.waiting() for head in queue.heads() if head.request is not None and head.rejection is None]
        view, settings = self.view, self.view.settings
        if not queue.subscribed or not held or not self.here.has_gpus:
            return True
        free = free_elsewhere(
            view.host_slots, view.host_kinds, view.running_jobs.jobs(now), settings.host, settings.gpu_kinds
        )
        if not served_elsewhere(held, self.here, free):
            return True
        self.until[queue.name] = now + AWAY_S
        log.info(
            "fleet.queue_left_for_kinds",
            priority_class=queue.name,
            held=[request.request_id for request in held[:5]],
            free_kinds=sorted(free),
            away_s=AWAY_S,
        )
        return False
