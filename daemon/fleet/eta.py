"""When each waiting request is expected to start: list scheduling of the fleet's order onto its slots.
Pure: the caller passes the order (`fleet_order`), the running jobs, the fleet's slots and `now`.
"""

from __future__ import annotations

import heapq

from daemon.fleet.order import Running, Waiting, time_left
from daemon.fleet.usage import Pace


def etas(order: list[Waiting], running: list[Running], slots: int, durations: Pace, now: float) -> dict[str, float | None]:
    """Each waiting request's ETA in seconds from `now`, by request id; None where nothing honest can be said.

    Each of the fleet's `slots` is free when its running job ends (daemon/fleet/order.py `time_left`: its own
    ETA, else its steps left at a step's pace, else its expected duration less the time it has run),
    else unknown; a slot with no job is free now. In order, each request takes its earliest free slots
    (as many as its GPUs) and starts when the last of them is free; they are then free again after its
    own expected duration (`durations.expected` at its steps). The fleet passes `order.paced` durations: a
    step's pace taken with the running jobs' of its method and model, for both. A start that needs a slot
    whose end is unknown, and every start after it, is None rather than a made-up figure (a request that
    finds a slot free now still starts now). A request needing more GPUs than the fleet has never starts:
    None, and it holds nothing up."""
    expected_s: dict[tuple[str, str, int | None], float | None] = {}
    known: list[float] = []  # the free times of the slots whose end is known (a heap)
    unknown = 0  # slots whose end is not known
    for job in running:
        left = time_left(job, durations, now)
        if left is None:
            unknown += job.gpus
        else:
            known.extend([now + left] * job.gpus)
    known.extend([now] * max(0, slots - len(known) - unknown))
    total = len(known) + unknown
    heapq.heapify(known)
    result: dict[str, float | None] = {}
    lost = False  # a start needed a slot of unknown end: no later start is known either
    for request in order:
        if lost or request.gpus > total:
            result[request.request_id] = None
            continue
        if len(known) < request.gpus or (unknown and heapq.nsmallest(request.gpus, known)[-1] > now):
            lost = True
            result[request.request_id] = None
            continue
        start = max(heapq.heappop(known) for _ in range(request.gpus))
        result[request.request_id] = start - now
        kind = (request.method, request.model)
        if (*kind, request.steps) not in expected_s:
            expected_s[(*kind, request.steps)] = durations.expected(*kind, request.steps)
        expected = expected_s[(*kind, request.steps)]
        if expected is None:
            unknown += request.gpus
        else:
            for _ in range(request.gpus):
                heapq.heappush(known, start + expected)
    return result
