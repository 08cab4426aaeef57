"""The fleet benchmark's two share figures (benchmarks/fleet_metrics.py): `fair_share_error`, within a class,
each team's share of the slot-time the class held against its weight's share (a share left idle lent), and
`order_share_error`, the fleet's order as a whole against an ideal that gives each class in turn the slots
it wants. Pure functions of the run's timeline (benchmarks/fleet_timeline.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from benchmarks.fleet_timeline import Arrival, Seen, timeline


def water_fill(capacity: float, demand: dict[str, int], weights: dict[str, float]) -> dict[str, float]:
    """Capacity split by weight among those who want it, none given more than it wants, the rest lent to the others."""
    given = {team: 0.0 for team in demand}
    active = {team for team, wanted in demand.items() if wanted > 0}
    while active and capacity > 1e-12:
        total = sum(weights.get(team, 1.0) for team in active)
        share = {team: capacity * weights.get(team, 1.0) / total for team in active}
        sated = {team for team in active if demand[team] - given[team] <= share[team]}
        if not sated:
            for team in active:
                given[team] += share[team]
            break
        for team in sated:
            capacity -= demand[team] - given[team]
            given[team] = float(demand[team])
        active -= sated
    return given


def wants(arrivals: Sequence[Arrival], caps: dict[str, int]) -> dict[str, int]:
    """The slots each team of `arrivals` may use: one a request, at most its cap (`max_slots`)."""
    wanted: dict[str, int] = defaultdict(int)
    for arrival in arrivals:
        wanted[arrival.team] += 1
    return {team: min(count, caps.get(team, count)) for team, count in wanted.items()}


def ideal_slots(
    waiting: Sequence[Arrival],
    running_: Sequence[Arrival],
    slots: int,
    classes: Sequence[str],
    weights: dict[str, float],
    caps: dict[str, int] | None = None,
) -> dict[str, float]:
    """Each team's slots in the fleet's order at one moment: classes served highest first, and within a class the
    slots left split by weight among the teams that want them (running or waiting, none past its cap), a share
    unused lent to the rest."""
    wanted: dict[str, dict[str, int]] = defaultdict(dict)
    for name in {a.priority_class for a in [*waiting, *running_]}:
        wanted[name] = wants([a for a in [*waiting, *running_] if a.priority_class == name], caps or {})
    order = [*classes, *sorted(set(wanted) - set(classes))]
    given: dict[str, float] = defaultdict(float)
    left = float(slots)
    for name in order:
        for team, count in water_fill(left, dict(wanted.get(name, {})), weights).items():
            given[team] += count
            left -= count
    return dict(given)


def fair_share_error(
    arrivals: Sequence[Arrival],
    events: Sequence[Seen],
    weights: dict[str, float],
    end: float,
    caps: dict[str, int] | None = None,
) -> float | None:
    """Fair share between teams, as the issue puts it (within a class, each team's share of slot-time follows its
    weight, a share left idle lent): over each class's contended window (one of its requests waits and two teams
    or more of it want slots), the largest gap between a team's share of the slot-time the class held and its
    weight's share of it (`water_fill` of the class's slots among the teams that want them, none past its cap in
    `caps`: a capped team's share left is lent to the others, as the fleet's order lends it). The largest over the
    classes; None when no class had such a window. How the slots are split between classes is
    `order_share_error`'s."""
    worst: float | None = None
    for name in sorted({a.priority_class for a in arrivals}):
        actual: dict[str, float] = defaultdict(float)
        ideal: dict[str, float] = defaultdict(float)
        for piece in timeline(arrivals, events, end):
            waiting = [a for a in piece.waiting if a.priority_class == name]
            running_ = [a for a in piece.running if a.priority_class == name]
            wanted = wants([*waiting, *running_], caps or {})
            if not waiting or len(wanted) < 2 or not running_:
                continue
            span = piece.end - piece.start
            for arrival in running_:
                actual[arrival.team] += span
            for team, count in water_fill(float(len(running_)), dict(wanted), weights).items():
                ideal[team] += count * span
        gap = largest_gap(actual, ideal)
        if gap is not None:
            worst = gap if worst is None else max(worst, gap)
    return worst


def order_share_error(
    arrivals: Sequence[Arrival],
    events: Sequence[Seen],
    slots: dict[str, int],
    classes: Sequence[str],
    weights: dict[str, float],
    end: float,
    caps: dict[str, int] | None = None,
) -> float | None:
    """The largest gap between a team's share of the slot-time used and its share in the fleet's order (`ideal_slots`),
    over the contended window: while a request waits and two teams or more want slots, whatever their classes. In the
    order's ideal a higher class has its slots the moment it arrives, so this counts the time a preemption takes
    (the stop at a step, the checkpoint, the slot's handoff) against the teams it served: with short urgent jobs
    it is mostly that. None when there was no such time."""
    actual: dict[str, float] = defaultdict(float)
    ideal: dict[str, float] = defaultdict(float)
    for piece in timeline(arrivals, events, end):
        teams = {a.team for a in [*piece.waiting, *piece.running]}
        if not piece.waiting or len(teams) < 2:
            continue
        span = piece.end - piece.start
        for arrival in piece.running:
            actual[arrival.team] += span
        for team, count in ideal_slots(
            piece.waiting, piece.running, sum(slots.values()), classes, weights, caps
        ).items():
            ideal[team] += count * span
    return largest_gap(actual, ideal)


def largest_gap(actual: dict[str, float], ideal: dict[str, float]) -> float | None:
    """The largest gap between a team's share of `actual` slot-time and its share of the
    `ideal`; None when either is none."""
    used, fair = sum(actual.values()), sum(ideal.values())
    if used <= 0 or fair <= 0:
        return None
    return max(abs(actual.get(team, 0.0) / used - ideal.get(team, 0.0) / fair) for team in set(actual) | set(ideal))
