"""When each waiting request is expected to start, and its place: list scheduling of the order they are expected to
start in onto the fleet's slots, after the preemptions the order will make (`places`). Pure: the caller passes the
waiting requests, the teams' usage, the running jobs, the fleet's slots, the teams' caps, the
preemption's bounds and `now`.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from daemon.admission.gpu_kinds import GpuNeed
from daemon.fleet.policy.kinds import SlotKinds
from daemon.fleet.policy.order import (
    FleetJob,
    FleetRequest,
    Standing,
    at_cap,
    remaining_work,
    share_of,
    start_order,
    time_left,
    victim,
)
from daemon.fleet.policy.usage import Pace
from daemon.settings.fleet import PriorityClass, TeamShare


@dataclass(frozen=True)
class Bounds:
    """What a preemption waits for: the operator's `preempt_min_run_s` and `preempt_max_count`, and the switch's
    seconds (daemon/fleet/policy/usage.py `Switches`: from the victim's `preempted` event to the new job's
    `started`)."""

    classes: list[PriorityClass]
    min_run_s: float
    max_count: int
    switch_s: float = 0.0


def preempting(
    order: list[FleetRequest],
    running: list[FleetJob],
    slots: int,
    bounds: Bounds,
    durations: Pace,
    now: float,
    teams: Mapping[str, TeamShare] | None = None,
    kinds: SlotKinds | None = None,
) -> tuple[list[FleetJob], dict[str, float]]:
    """The running jobs as they will be once the waiting requests that preempt have, and each such request's ETA.

    In order, each request that finds no free slot of the fleet's `slots`, its team below its cap (`order.pick`
    neither starts nor preempts for a team at its cap), and has a victim (`order.victim`, as the host running the
    job chooses it, every job of a preemptible class taken to be at a step it can stop at) at the first moment one
    is allowed: now, or when a job reaches `min_run_s` of run (a job preempted `max_count` times never is). It
    starts then plus the switch's seconds, in the victim's slots, and holds them for its expected time (at
    `durations`); the job it stops waits again (not counted: it resumes after the requests that ETAs are given for
    here, as far as they go). A request that a job's own end frees a slot for by then takes that slot instead
    (`etas` starts it there). With `kinds`, free slots and victims are counted by kind: a request takes a free slot,
    or stops a job, only on a kind of GPU that serves it (daemon/fleet/policy/kinds.py)."""
    free: dict[str | None, int] = dict(kinds.slots) if kinds is not None else {None: slots}
    for job in running:
        if not job.on_ray:  # a job on Ray holds its team's share, none of the fleet's slots
            on = kinds.of_job(job) if kinds is not None else None
            free[on] = free.get(on, 0) - job.gpus
    holding: Counter[str] = Counter()
    for job in running:
        holding[job.team] += job.gpus
    candidates = [replace(job, preemptible=True) for job in running if not job.on_ray]
    after, starts = list(running), {}
    # What `victim` finds depends on a request's class and GPUs alone, and on the candidates, which change only when one
    # is stopped: found once for each (class, GPUs) until then. Thousands waiting behind a full fleet each looked
    # through every running job at every moment one may be stopped, and took the announcer's round half a second
    # (benchmarks.fleet_scale, 10,000 waiting).
    found_for: dict[tuple[str, int, GpuNeed | None], tuple[float, FleetJob] | None] = {}
    for request in order:
        if at_cap(request.team, holding, teams or {}, request.gpus):
            continue
        serving = kinds.serve(request, kinds.order()) if kinds is not None else [None]
        roomy = [on for on in serving if request.gpus <= free.get(on, 0)]
        if roomy:  # it takes a free slot: `etas` starts it there
            free[roomy[0]] -= request.gpus
            holding[request.team] += request.gpus
            continue
        kind = (request.priority_class, request.gpus, request.need)
        if kind not in found_for:
            stoppable = [job for job in candidates if kinds is None or kinds.of_job(job) in serving]
            found_for[kind] = _first_victim(request, stoppable, bounds, now)
        found = found_for[kind]
        if found is None:
            continue
        at, stopped = found
        ends = [now + left for job in after if (left := time_left(job, durations, now)) is not None]
        if at > now and min(ends, default=math.inf) <= at:
            continue  # a slot frees before the victim may be stopped
        candidates.remove(stopped)
        found_for.clear()
        after = [job for job in after if job.request_id != stopped.request_id]
        holding[stopped.team] -= stopped.gpus
        holding[request.team] += request.gpus
        start = at + bounds.switch_s - now
        starts[request.request_id] = start
        expected = durations.expected(request.method, request.model, request.steps)
        after.append(
            FleetJob(
                request.request_id,
                request.priority_class,
                request.team,
                now,
                request.method,
                request.model,
                eta_s=None if expected is None else start + expected,
                host=stopped.host,  # in the victim's slots, of its host's kind
                gpus=request.gpus,
            )
        )
    return after, starts


def _first_victim(
    request: FleetRequest, candidates: list[FleetJob], bounds: Bounds, now: float
) -> tuple[float, FleetJob] | None:
    """The first moment a job of `candidates` may be stopped for `request` (now, or when one reaches `min_run_s`), and
    that job; None if never."""
    allowed = sorted(
        {now, *(job.started + bounds.min_run_s for job in candidates if job.started + bounds.min_run_s > now)}
    )
    return next(
        (
            (at, stopped)
            for at in allowed
            if (stopped := victim(request, candidates, bounds.classes, bounds.min_run_s, bounds.max_count, at))
            is not None
        ),
        None,
    )


def places(
    waiting: list[FleetRequest],
    usage: Mapping[str, float],
    running: list[FleetJob],
    slots: int,
    bounds: Bounds,
    pace: Pace,
    now: float,
    teams: Mapping[str, TeamShare],
    kinds: SlotKinds | None = None,
    most_per_host: int | None = None,
) -> list[tuple[FleetRequest, int, float | None]]:
    """Each waiting request with its place in the order they are expected to start and its ETA (seconds): the fleet's
    order with no team deferred for its cap (`order.start_order`: `usage`, each team's decayed slot-seconds, and the
    running jobs' work left), the preemptions it will make first (`preempting`), then list scheduling of the rest onto
    the fleet's `slots` (`etas`, each team held to its cap; with `kinds`, each request on the kinds of GPU that serve
    it), placed by their starts (`ranked`). A request of more GPUs than any host has (`most_per_host`, as the hosts
    said them), or across several hosts, runs on a Ray cluster if anywhere, not on these slots: it keeps its place
    in the order, takes none of them and has no ETA. One function for what a host tells in a `queued` event
    (daemon/fleet/view.py) and what `adapterd get` and `jobs` say (daemon/cli/places.py)."""
    ahead = remaining_work(running, pace, now)
    order = start_order(waiting, Standing(bounds.classes, teams, usage, ahead=ahead, pace=pace))
    on_slots = [w for w in order if w.hosts == 1 and (most_per_host is None or w.gpus <= most_per_host)]
    after, starts = preempting(on_slots, running, slots, bounds, pace, now, teams, kinds)
    eta = {**etas([w for w in on_slots if w.request_id not in starts], after, slots, pace, now, teams, kinds), **starts}
    return ranked(order, eta)


def ranked(order: list[FleetRequest], eta: Mapping[str, float | None]) -> list[tuple[FleetRequest, int, float | None]]:
    """Each request of `order` (`order.start_order`) with its place and its ETA: places in the order of the expected
    starts (a request held by its team's cap starts after some of those behind it), those
    with none after, in `order`."""
    index = sorted(
        range(len(order)), key=lambda i: (eta.get(order[i].request_id) is None, eta.get(order[i].request_id) or 0.0, i)
    )
    return [(order[i], place, eta.get(order[i].request_id)) for place, i in enumerate(index, start=1)]


def etas(
    order: list[FleetRequest],
    running: list[FleetJob],
    slots: int,
    durations: Pace,
    now: float,
    teams: Mapping[str, TeamShare] | None = None,
    kinds: SlotKinds | None = None,
) -> dict[str, float | None]:
    """Each waiting request's ETA in seconds from `now`, by request id; None where nothing honest can be said.

    Each of the fleet's `slots` is free when its running job ends (daemon/fleet/policy/order.py `time_left`: its own
    ETA, else its steps left at a step's pace, else its expected duration less the time it has run),
    else unknown; a slot with no job is free now. In order, each request takes free slots (as many as its
    GPUs) and starts when the last of them is free; they are then free again after its own expected duration
    (`durations.expected` at its steps). The fleet passes `order.paced` durations: a step's pace taken with the
    running jobs' of its method and model, for both.

    With `kinds` (daemon/fleet/policy/kinds.py: the hosts said their GPUs' kinds) the slots are those of `kinds` by
    kind, each running job on its host's kind, and a request that asks for a kind or a GPU's memory (`need`) takes slots
    of one kind that serves it, the kind it starts soonest on (among equals the one of least memory): an H100-only
    request waits for an H100 slot even when an L4 one frees first.

    A team's `max_slots` cap (`teams`) is hard, as `order.pick` keeps it: a request of a team that holds its cap
    (its running jobs, and the requests of the order placed before it, each until its end) starts no sooner than
    enough of them end. It then takes the free slots that are free last by its start (best fit), so a slot that
    frees while it still waits for its team goes to the requests behind it, as the dispatcher gives it to them.

    A start that needs a slot, or a team's job, whose end is unknown, and every start after it on those kinds, is
    None rather than a made-up figure (a request that finds a slot free now, its team below its cap, still starts
    now). A request needing more GPUs than the fleet has of any kind that serves it, or than its team's cap, never
    starts: None, and it holds nothing up. A job on a host's Ray cluster (`on_ray`) holds its team's share until its
    end and none of these slots: its GPUs are the cluster's."""
    expected_s: dict[tuple[str, str, int | None], float | None] = {}
    pools: dict[str | None, _Pool] = {on: _Pool() for on in (kinds.order() if kinds is not None else [None])}
    held: dict[str, list[float]] = {}  # each capped team's slots held, by their ends (inf: unknown), sorted

    def cap(team: str) -> int | None:
        return share_of(team, teams or {}).max_slots

    def hold(team: str, end: float, gpus: int) -> None:
        if cap(team) is not None:
            for _ in range(gpus):
                bisect.insort(held.setdefault(team, []), end)

    for job in running:
        left = time_left(job, durations, now)
        if job.on_ray:  # its team's share until its end, none of the fleet's slots
            hold(job.team, math.inf if left is None else now + left, job.gpus)
            continue
        pool = pools.setdefault(kinds.of_job(job) if kinds is not None else None, _Pool())
        if left is None:
            pool.unknown += job.gpus
        else:
            pool.known.extend([now + left] * job.gpus)
        hold(job.team, math.inf if left is None else now + left, job.gpus)
    for on, pool in pools.items():
        size = kinds.slots.get(on, 0) if kinds is not None else slots
        pool.known.extend([now] * max(0, size - len(pool.known) - pool.unknown))
        pool.known.sort()
        pool.total = len(pool.known) + pool.unknown
    result: dict[str, float | None] = {}
    lost: set[str | None] = set()  # kinds where a start needed a slot of unknown end: no later start is known there
    for request in order:
        limit = cap(request.team)
        serving = kinds.serve(request, pools) if kinds is not None else ONE_KIND
        fits = [on for on in serving if request.gpus <= pools[on].total]
        if not fits or (limit is not None and request.gpus > limit):
            result[request.request_id] = None
            continue
        if lost.intersection(fits):
            lost.update(fits)
            result[request.request_id] = None
            continue
        ready = now  # when its team holds few enough slots for it
        if limit is not None:
            ends = held.get(request.team, [])
            # Held at t: the ends after t. The k-th end leaves at most len - k held, and the request needs limit - gpus.
            k = len(ends) - (limit - request.gpus)
            ready = max(now, ends[k - 1]) if k > 0 else now
        chosen = _soonest(pools, fits, request.gpus, ready)
        if chosen is None:
            lost.update(fits)
            result[request.request_id] = None
            continue
        start, pool = chosen
        taken = bisect.bisect_right(pool.known, start)
        del pool.known[taken - request.gpus : taken]
        result[request.request_id] = start - now
        kind = (request.method, request.model)
        if (*kind, request.steps) not in expected_s:
            expected_s[(*kind, request.steps)] = durations.expected(*kind, request.steps)
        expected = expected_s[(*kind, request.steps)]
        if expected is None:
            pool.unknown += request.gpus
        else:
            for _ in range(request.gpus):
                bisect.insort(pool.known, start + expected)
        hold(request.team, math.inf if expected is None else start + expected, request.gpus)
    return result


ONE_KIND: list[str | None] = [None]  # the slots of a fleet whose hosts said no kind: one pool (never changed)


def _soonest(
    pools: Mapping[str | None, _Pool], fits: list[str | None], gpus: int, ready: float
) -> tuple[float, _Pool] | None:
    """The start of a request of `gpus` ready at `ready` on the kind of `fits` it starts soonest on (among equals the
    first), and that kind's pool; None when a kind whose start is unknown (a slot of unknown end) may start it sooner
    than any known one, which it may unless one starts it when it is ready."""
    if len(fits) == 1:  # one kind (every fleet whose hosts say none): no choice to make
        pool = pools[fits[0]]
        start = pool.start(gpus, ready)
        return None if start is None else (start, pool)
    best: tuple[float, _Pool] | None = None
    unknown = False
    for on in fits:
        start = pools[on].start(gpus, ready)
        if start is None:
            unknown = True
        elif best is None or start < best[0]:
            best = (start, pools[on])
    return None if best is None or (unknown and best[0] > ready) else best


@dataclass
class _Pool:
    """The slots of one kind: the free times of those whose end is known (sorted), how many have an unknown end, and
    how many there are."""

    known: list[float] = field(default_factory=list)
    unknown: int = 0
    total: int = 0

    def start(self, gpus: int, ready: float) -> float | None:
        """When `gpus` of these slots are free for a request ready at `ready`; None when a slot of unknown end is
        needed for it (or the team is never ready)."""
        if ready == math.inf or len(self.known) < gpus or (self.unknown and self.known[gpus - 1] > ready):
            return None
        return max(ready, self.known[gpus - 1])
