"""When each waiting request is expected to start: list scheduling of the fleet's order onto its slots.
Pure: the caller passes the order (`fleet_order`), the running jobs, the fleet's slots, the teams' caps and `now`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping

from daemon.fleet.order import Running, Waiting, share_of, time_left
from daemon.fleet.usage import Pace
from daemon.fleet_config import TeamShare


def etas(order: list[Waiting], running: list[Running], slots: int, durations: Pace, now: float,
         teams: Mapping[str, TeamShare] | None = None) -> dict[str, float | None]:
    """Each waiting request's ETA in seconds from `now`, by request id; None where nothing honest can be said.

    Each of the fleet's `slots` is free when its running job ends (daemon/fleet/order.py `time_left`: its own
    ETA, else its steps left at a step's pace, else its expected duration less the time it has run),
    else unknown; a slot with no job is free now. In order, each request takes free slots (as many as its
    GPUs) and starts when the last of them is free; they are then free again after its own expected duration
    (`durations.expected` at its steps). The fleet passes `order.paced` durations: a step's pace taken with the
    running jobs' of its method and model, for both.

    A team's `max_slots` cap (`teams`) is hard, as `order.pick` keeps it: a request of a team that holds its cap
    (its running jobs, and the requests of the order placed before it, each until its end) starts no sooner than
    enough of them end. It then takes the free slots that are free last by its start (best fit), so a slot that
    frees while it still waits for its team goes to the requests behind it, as the dispatcher gives it to them.

    A start that needs a slot, or a team's job, whose end is unknown, and every start after it, is None
    rather than a made-up figure (a request that finds a slot free now, its team below its cap, still starts
    now). A request needing more GPUs than the fleet has, or than its team's cap, never starts: None, and it
    holds nothing up."""
    expected_s: dict[tuple[str, str, int | None], float | None] = {}
    known: list[float] = []  # the free times of the slots whose end is known, sorted
    unknown = 0  # slots whose end is not known
    held: dict[str, list[float]] = {}  # each capped team's slots held, by their ends (inf: unknown), sorted

    def cap(team: str) -> int | None:
        return share_of(team, teams or {}).max_slots

    def hold(team: str, end: float, gpus: int) -> None:
        if cap(team) is not None:
            for _ in range(gpus):
                bisect.insort(held.setdefault(team, []), end)

    for job in running:
        left = time_left(job, durations, now)
        if left is None:
            unknown += job.gpus
        else:
            known.extend([now + left] * job.gpus)
        hold(job.team, math.inf if left is None else now + left, job.gpus)
    known.extend([now] * max(0, slots - len(known) - unknown))
    total = len(known) + unknown
    known.sort()
    result: dict[str, float | None] = {}
    lost = False  # a start needed a slot of unknown end: no later start is known either
    for request in order:
        limit = cap(request.team)
        if lost or request.gpus > total or (limit is not None and request.gpus > limit):
            result[request.request_id] = None
            continue
        ready = now  # when its team holds few enough slots for it
        if limit is not None:
            ends = held.get(request.team, [])
            # Held at t: the ends after t. The k-th end leaves at most len - k held, and the request needs limit - gpus.
            k = len(ends) - (limit - request.gpus)
            ready = max(now, ends[k - 1]) if k > 0 else now
        if ready == math.inf or len(known) < request.gpus or (unknown and known[request.gpus - 1] > ready):
            lost = True
            result[request.request_id] = None
            continue
        start = max(ready, known[request.gpus - 1])
        taken = bisect.bisect_right(known, start)
        del known[taken - request.gpus:taken]
        result[request.request_id] = start - now
        kind = (request.method, request.model)
        if (*kind, request.steps) not in expected_s:
            expected_s[(*kind, request.steps)] = durations.expected(*kind, request.steps)
        expected = expected_s[(*kind, request.steps)]
        if expected is None:
            unknown += request.gpus
        else:
            for _ in range(request.gpus):
                bisect.insort(known, start + expected)
        hold(request.team, math.inf if expected is None else start + expected, request.gpus)
    return result
