"""With priority classes, a request of several GPUs is not starved by one-GPU requests: the host that holds it first
in its view of the fleet's order drains for it (daemon/jobs/reservation.py is the same rule for one host without
classes). Pure: the caller passes the request, this host's slots and jobs, a step's pace and `now`.

Which host is reserved is a pure function of what the hosts read (no coordination service): the one whose
dispatcher holds the request at the head of its window, by the class queue's consumer group; that host alone can
claim it. It is reserved when the request is the first of the fleet's order among the heads it holds (`order.pick`
with no regard to free slots: a higher class or a team further below its share goes first, as ever), needs more
GPUs than are free there and no more than the host has, and has waited `reserve_after_s` since its arrival (the
signed arrival every host reads alike: daemon/fleet/choice.py `Arrivals`). The reservation is due when the host's jobs
are expected to free enough slots (`order.time_left`: their ETAs, else their steps left at the pace, else their expected
rest); meanwhile a request starts there only when its expected duration (`Pace.expected` at its `max_steps`) ends
it no later (`backfills`). One of unknown duration never does, nor any while a job's end is unknown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from daemon.fleet.policy.order import FleetJob, FleetRequest, time_left
from daemon.fleet.policy.usage import Pace
from daemon.jobs import reservation


@dataclass(frozen=True)
class Drain:
    """This host reserved for `head`: enough of its slots are expected free at `due` (epoch seconds; inf: unknown)."""

    head: FleetRequest
    due: float
    free_at: dict[str, float]  # each of the host's slots: when it is expected free (now: free now)


def drain(
    first: FleetRequest | None,
    free: int,
    slots: int,
    here: Sequence[FleetJob],
    durations: Pace,
    now: float,
    after_s: float,
) -> Drain | None:
    """Whether this host drains for `first`, the first of the fleet's order among the heads it holds: the module's rule.
    `free`: its slots free now for a new request; `slots`: all of them; `here`: its jobs and claims holding the rest."""
    if first is None or first.gpus < 2 or first.gpus <= free or first.gpus > slots or now - first.arrived < after_s:
        return None
    free_at = {f"free-{index}": now for index in range(free)}
    for job in here:
        left = time_left(job, durations, now)
        for index in range(job.gpus):
            free_at[f"{job.request_id}-{index}"] = math.inf if left is None else now + left
    for index in range(len(free_at), slots):  # a slot held by what the caller did not list (a job stopping): unknown
        free_at[f"held-{index}"] = math.inf
    return Drain(first, reservation.due(free_at, first.gpus), free_at)


def backfills(request: FleetRequest, held: Drain, durations: Pace, now: float) -> bool:
    """Whether `request` may start on a host drained for `held.head` (the reservation itself always may)."""
    if request.request_id == held.head.request_id:
        return True
    expected = durations.expected(request.method, request.model, request.steps)
    free = sorted(slot for slot, at in held.free_at.items() if at <= now)
    if len(free) < request.gpus:
        return False
    return reservation.backfills(
        held.free_at, free[: request.gpus], None if expected is None else now + expected, held.head.gpus
    )
