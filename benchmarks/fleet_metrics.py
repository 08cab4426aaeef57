"""The fleet benchmark's figures (benchmarks/fleet.py), as pure functions of what the fleet said.

Inputs are the lifecycle events, each reduced to a `Seen` (its type, request, time and host, and
the few fields a figure reads), the requests as they were published (`Arrival`: the record's
timestamp, the benchmark's class and team for it), each host's slots, the classes highest first,
the teams' weights and the Hub's commits per request. Nothing here reads a clock or a broker, so
each figure is unit-tested on constructed event lists (tests/test_fleet_metrics.py).

A job holds a slot from its `accepted` to its request's next `succeeded`, `failed`, `cancelled`,
`preempted` or `retrying` from the same host (an occupancy with no end holds it to the run's end), a
`succeeded` less its push (durations_s): the daemon gives the slot to the next request when the job's
child exits, while the adapter is pushed;
a request waits from its arrival, and again after a preemption or a retry, until its next
`accepted`. Every slot here fits every request (the benchmark's slots are alike CPU slots), so a
request waiting anywhere could use any free slot.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas import Event

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})
# What ends a job's hold on its slot (a rejected request never held one).
RELEASES = frozenset({"succeeded", "failed", "cancelled", "preempted", "retrying"})
# The ETA's error is relative to the wait, or to this when the wait was shorter: a near-zero wait would
# turn any ETA into an enormous ratio.
MIN_WAIT_S = 1.0


@dataclass(frozen=True)
class Seen:
    """One lifecycle event, reduced to what the figures read."""

    type: str
    request_id: str
    at: float  # the event's time, seconds since the epoch
    host: str
    step: int | None = None  # progress, checkpoint, preempted: the step reached
    total_steps: int | None = None  # progress
    resumed_step: int | None = None  # started: the checkpoint it resumed from
    eta_s: float | None = None  # queued
    stage: str = "train"  # progress: train or evaluate
    duplicate: bool = False  # succeeded: an earlier success answered again
    push_s: float = 0.0  # succeeded: the push's seconds, after the slot was given back


@dataclass(frozen=True)
class Arrival:
    """A request as it was published: when its record landed (the record's timestamp), its class and team."""

    request_id: str
    at: float
    priority_class: str
    team: str


@dataclass(frozen=True)
class Hold:
    """A job's hold on a slot: `accepted` to what released it (`end` is the run's end when nothing did)."""

    request_id: str
    host: str
    start: float
    end: float


def seen(event: Event) -> Seen | None:
    """The event as the figures read it; None for one without a request id (an unreadable message's rejection)."""
    if event.request_id is None:
        return None
    base = Seen(event.type, event.request_id, event.time.timestamp(), event.host)
    if event.type == "progress":
        return replace(base, step=event.step, total_steps=event.total_steps, stage=event.stage)
    if event.type in ("checkpoint", "preempted"):
        return replace(base, step=event.step)
    if event.type == "started":
        return replace(base, resumed_step=event.resumed_step)
    if event.type == "queued":
        return replace(base, eta_s=event.eta_s)
    if event.type == "succeeded":
        return replace(base, duplicate=event.duplicate, push_s=event.durations_s.get("push", 0.0))
    return base


def run_end(events: Iterable[Seen]) -> float:
    """The last event's time."""
    return max(event.at for event in events)


def holds(events: Sequence[Seen], end: float) -> list[Hold]:
    """Every job's hold on a slot, in the order they began."""
    found: list[Hold] = []
    open_: dict[tuple[str, str], float] = {}
    for event in sorted(events, key=lambda e: e.at):
        key = (event.request_id, event.host)
        if event.type == "accepted":
            if key in open_:  # accepted again with no release between (a restart): the earlier hold ends here
                found.append(Hold(event.request_id, event.host, open_.pop(key), event.at))
            open_[key] = event.at
        elif event.type in RELEASES and key in open_:
            start = open_.pop(key)
            found.append(Hold(event.request_id, event.host, start, max(start, event.at - event.push_s)))
    found += [Hold(request_id, host, start, end) for (request_id, host), start in open_.items()]
    return sorted(found, key=lambda hold: hold.start)


def holding(events: Iterable[Seen]) -> int:
    """How many jobs hold a slot after these events (accepted, not yet released)."""
    held: set[tuple[str, str]] = set()
    for event in sorted(events, key=lambda e: e.at):
        if event.type == "accepted":
            held.add((event.request_id, event.host))
        elif event.type in RELEASES:
            held.discard((event.request_id, event.host))
    return len(held)


def terminal_at(events: Iterable[Seen]) -> dict[str, float]:
    """Each request's first terminal event's time."""
    found: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.at):
        if event.type in TERMINAL:
            found.setdefault(event.request_id, event.at)
    return found


def finished_at(events: Iterable[Seen]) -> dict[str, float]:
    """When each request stopped wanting a slot: its first terminal event, a `succeeded` less its push."""
    found: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.at):
        if event.type in TERMINAL:
            found.setdefault(event.request_id, event.at - event.push_s)
    return found


@dataclass(frozen=True)
class Slice:
    """A stretch of the run in which nothing changed: per host the jobs holding slots, and who waits and who runs."""

    start: float
    end: float
    busy: dict[str, int]
    waiting: list[Arrival]
    running: list[Arrival]


def timeline(arrivals: Sequence[Arrival], events: Sequence[Seen], end: float) -> list[Slice]:
    """The run from its first arrival to `end`, cut wherever a request arrived, took or let go of a slot, or ended."""
    by_id = {arrival.request_id: arrival for arrival in arrivals}
    found = [hold for hold in holds(events, end) if hold.request_id in by_id]
    done = finished_at(events)
    start = min(arrival.at for arrival in arrivals)
    cuts = sorted({start, end} | {a.at for a in arrivals} | {h.start for h in found} | {h.end for h in found} | set(done.values()))
    cuts = [t for t in cuts if start <= t <= end]
    slices = []
    for left, right in zip(cuts, cuts[1:], strict=False):
        middle = (left + right) / 2
        now = [hold for hold in found if hold.start <= middle < hold.end]
        held = {hold.request_id for hold in now}
        busy: dict[str, int] = defaultdict(int)
        for hold in now:
            busy[hold.host] += 1
        waiting = [a for a in arrivals if a.at <= middle and a.request_id not in held and done.get(a.request_id, math.inf) > middle]
        slices.append(Slice(left, right, dict(busy), waiting, [by_id[request_id] for request_id in sorted(held)]))
    return slices


def idle_share(arrivals: Sequence[Arrival], events: Sequence[Seen], slots: dict[str, int], end: float) -> float:
    """Slot-seconds a slot was free while a request waited anywhere, over all slot-seconds from the first arrival to `end`."""
    slices = timeline(arrivals, events, end)
    total = sum(slots.values()) * (end - min(a.at for a in arrivals))
    idle = 0.0
    for piece in slices:
        free = sum(max(0, count - piece.busy.get(host, 0)) for host, count in slots.items())
        idle += min(free, len(piece.waiting)) * (piece.end - piece.start)
    return idle / total if total > 0 else 0.0


def greedy_schedule(arrivals: Sequence[Arrival], durations: dict[str, float], slots: int, classes: Sequence[str]) -> dict[str, float]:
    """When each request starts in a greedy work-conserving list schedule: whenever a slot is free it takes the
    waiting request of the highest class, earliest arrival first, and runs it for its duration."""
    rank = {name: n for n, name in enumerate(classes)}
    pending = sorted((a for a in arrivals if a.request_id in durations), key=lambda a: a.at)
    free_at = [pending[0].at if pending else 0.0] * slots
    starts: dict[str, float] = {}
    while pending:
        now = min(free_at)
        ready = [a for a in pending if a.at <= now]
        if not ready:  # idle until the next arrival
            free_at[free_at.index(now)] = min(a.at for a in pending)
            continue
        chosen = min(ready, key=lambda a: (rank.get(a.priority_class, len(rank)), a.at))
        pending.remove(chosen)
        starts[chosen.request_id] = now
        free_at[free_at.index(now)] = now + durations[chosen.request_id]
    return starts


def greedy_makespan(arrivals: Sequence[Arrival], durations: dict[str, float], slots: int, classes: Sequence[str]) -> float:
    """The greedy schedule's makespan: its first arrival to its last finish."""
    starts = greedy_schedule(arrivals, durations, slots, classes)
    if not starts:
        return 0.0
    first = min(a.at for a in arrivals if a.request_id in starts)
    return max(start + durations[request_id] for request_id, start in starts.items()) - first


def makespan_ratio(arrivals: Sequence[Arrival], events: Sequence[Seen], slots: dict[str, int], classes: Sequence[str],
                   end: float) -> float | None:
    """The run's makespan (first arrival to `end`) over the greedy schedule's of the same measured job durations
    (each request's slot-time, every hold of it added up) on the same number of slots; None when nothing ran."""
    durations: dict[str, float] = defaultdict(float)
    for hold in holds(events, end):
        durations[hold.request_id] += hold.end - hold.start
    ideal = greedy_makespan(arrivals, dict(durations), sum(slots.values()), classes)
    actual = end - min(a.at for a in arrivals)
    return actual / ideal if ideal > 0 else None


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


def ideal_slots(waiting: Sequence[Arrival], running_: Sequence[Arrival], slots: int, classes: Sequence[str],
                weights: dict[str, float]) -> dict[str, float]:
    """Each team's slots in the fleet's order at one moment: classes served highest first, and within a class the
    slots left split by weight among the teams that want them (running or waiting), a share unused lent to the rest."""
    wanted: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for arrival in [*waiting, *running_]:
        wanted[arrival.priority_class][arrival.team] += 1
    order = [*classes, *sorted(set(wanted) - set(classes))]
    given: dict[str, float] = defaultdict(float)
    left = float(slots)
    for name in order:
        for team, count in water_fill(left, dict(wanted.get(name, {})), weights).items():
            given[team] += count
            left -= count
    return dict(given)


def fair_share_error(arrivals: Sequence[Arrival], events: Sequence[Seen], weights: dict[str, float], end: float) -> float | None:
    """Fair share between teams, as the issue puts it (within a class, each team's share of slot-time follows its
    weight, a share left idle lent): over each class's contended window (one of its requests waits and two teams
    or more of it want slots), the largest gap between a team's share of the slot-time the class held and its
    weight's share of it (`water_fill` of the class's slots among the teams that want them). The largest over the
    classes; None when no class had such a window. How the slots are split between classes is
    `order_share_error`'s."""
    worst: float | None = None
    for name in sorted({a.priority_class for a in arrivals}):
        actual: dict[str, float] = defaultdict(float)
        ideal: dict[str, float] = defaultdict(float)
        for piece in timeline(arrivals, events, end):
            waiting = [a for a in piece.waiting if a.priority_class == name]
            running_ = [a for a in piece.running if a.priority_class == name]
            wanted: dict[str, int] = defaultdict(int)
            for arrival in [*waiting, *running_]:
                wanted[arrival.team] += 1
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


def order_share_error(arrivals: Sequence[Arrival], events: Sequence[Seen], slots: dict[str, int], classes: Sequence[str],
                      weights: dict[str, float], end: float) -> float | None:
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
        for team, count in ideal_slots(piece.waiting, piece.running, sum(slots.values()), classes, weights).items():
            ideal[team] += count * span
    return largest_gap(actual, ideal)


def largest_gap(actual: dict[str, float], ideal: dict[str, float]) -> float | None:
    """The largest gap between a team's share of `actual` slot-time and its share of the `ideal`; None when either is none."""
    used, fair = sum(actual.values()), sum(ideal.values())
    if used <= 0 or fair <= 0:
        return None
    return max(abs(actual.get(team, 0.0) / used - ideal.get(team, 0.0) / fair) for team in set(actual) | set(ideal))


def first_step_at(events: Sequence[Seen]) -> dict[str, float]:
    """When each request reached its first optimizer step (its first training `progress`; its `started` if it sent none)."""
    progress: dict[str, float] = {}
    started: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.at):
        if event.type == "progress" and event.stage == "train":
            progress.setdefault(event.request_id, event.at)
        elif event.type == "started":
            started.setdefault(event.request_id, event.at)
    return {**started, **progress}


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (the value at rank ceil(share·n))."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def start_p95(arrivals: Sequence[Arrival], events: Sequence[Seen], priority_class: str) -> float | None:
    """The 95th percentile of arrival to first step over the class's requests that trained; None when none did."""
    reached = first_step_at(events)
    waits = [reached[a.request_id] - a.at for a in arrivals if a.priority_class == priority_class and a.request_id in reached]
    return percentile(waits, 0.95) if waits else None


def eta_median_error(events: Sequence[Seen]) -> float | None:
    """The median relative error of the ETA each request's first `queued` event gave (with an ETA), against the
    wait it had from that event to its next `started`, relative to the wait or MIN_WAIT_S if longer (an ETA of 0 for a
    start 0.1 s later is off by 0.1 s, a tenth of the floor, not by the whole floor). None with no such event."""
    ordered = sorted(events, key=lambda e: e.at)
    errors = []
    judged: set[str] = set()
    for n, event in enumerate(ordered):
        if event.type != "queued" or event.eta_s is None or event.request_id in judged:
            continue
        start = next((e.at for e in ordered[n + 1:] if e.request_id == event.request_id and e.type == "started"), None)
        if start is None:
            continue
        judged.add(event.request_id)
        wait = start - event.at
        errors.append(abs(event.eta_s - wait) / max(wait, MIN_WAIT_S))
    return statistics.median(errors) if errors else None


def preemptions(events: Iterable[Seen]) -> int:
    return sum(1 for event in events if event.type == "preempted")


def steps_retrained_per_preemption(events: Sequence[Seen]) -> float | None:
    """Steps trained again per preemption: the step reached when preempted (the event's `step`, else the last
    progress before it) less the step its next `started` resumed from. None with no preemption."""
    ordered = sorted(events, key=lambda e: e.at)
    retrained = []
    for n, event in enumerate(ordered):
        if event.type != "preempted":
            continue
        reached = event.step
        if reached is None:
            reached = max((e.step or 0 for e in ordered[:n] if e.request_id == event.request_id and e.type == "progress"), default=0)
        resumed = next((e for e in ordered[n + 1:] if e.request_id == event.request_id and e.type == "started"), None)
        if resumed is not None:
            retrained.append(float(max(0, reached - (resumed.resumed_step or 0))))
    return statistics.mean(retrained) if retrained else None


def lost(arrivals: Iterable[Arrival], events: Iterable[Seen]) -> int:
    """Requests with no terminal event."""
    done = terminal_at(events)
    return sum(1 for arrival in arrivals if arrival.request_id not in done)


@dataclass
class Training:
    """One `started` of a request and what its host said of it after (until that host starts it again)."""

    request_id: str
    host: str
    start: float
    last: float  # its last event
    reached_end: bool = False  # trained its last step (a training progress at total_steps)


def trainings(events: Sequence[Seen]) -> list[Training]:
    opened: dict[tuple[str, str], Training] = {}
    found: list[Training] = []
    for event in sorted(events, key=lambda e: e.at):
        key = (event.request_id, event.host)
        if event.type == "started":
            if key in opened:
                found.append(opened.pop(key))
            opened[key] = Training(event.request_id, event.host, event.at, event.at)
        elif key in opened:
            training = opened[key]
            training.last = event.at
            if event.type == "progress" and event.stage == "train" and event.step is not None and event.step == event.total_steps:
                training.reached_end = True
    return found + list(opened.values())


def duplicate_trainings(events: Sequence[Seen]) -> int:
    """Requests trained twice: two of its trainings at once (one started before the other's last event), or
    two that each trained to the last step."""
    by_request: dict[str, list[Training]] = defaultdict(list)
    for training in trainings(events):
        by_request[training.request_id].append(training)
    twice = 0
    for runs in by_request.values():
        runs.sort(key=lambda t: t.start)
        overlap = any(later.start < earlier.last for n, earlier in enumerate(runs) for later in runs[n + 1:])
        if overlap or sum(run.reached_end for run in runs) > 1:
            twice += 1
    return twice


def duplicate_commits(commits: dict[str, int]) -> int:
    """Requests with more than one commit of their adapter."""
    return sum(1 for count in commits.values() if count > 1)


def fleet_line(figures: dict[str, object]) -> str:
    """`FLEET key=value ...`: floats to three decimals, None as n/a."""
    def shown(value: object) -> str:
        if value is None:
            return "n/a"
        if isinstance(value, float):
            return f"{value:.3f}"
        return str(value)

    return "FLEET " + " ".join(f"{key}={shown(value)}" for key, value in figures.items())


def parse_fleet_line(line: str) -> dict[str, str]:
    """The key=value pairs of a FLEET line; ValueError when it is not one."""
    head, _, rest = line.strip().partition(" ")
    if head != "FLEET":
        raise ValueError(f"not a FLEET line: {line!r}")
    return dict(pair.split("=", 1) for pair in rest.split())


def figures(arrivals: Sequence[Arrival], events: Sequence[Seen], slots: dict[str, int], classes: Sequence[str],
            weights: dict[str, float], commits: dict[str, int], urgent_class: str = "urgent", end: float | None = None) -> dict[str, object]:
    """Every figure of the FLEET line, in its order, over the run from the first arrival to `end` (unset: the
    requests' last event, which is where the run ends when every one of them ended)."""
    mine = {arrival.request_id for arrival in arrivals}
    events = [event for event in events if event.request_id in mine]
    if end is None:
        end = run_end(events) if events else max(a.at for a in arrivals)
    return {
        "urgent_start_p95_s": start_p95(arrivals, events, urgent_class),
        "idle_share": idle_share(arrivals, events, slots, end),
        "makespan_ratio": makespan_ratio(arrivals, events, slots, classes, end),
        "fair_share_error": fair_share_error(arrivals, events, weights, end),
        "order_share_error": order_share_error(arrivals, events, slots, classes, weights, end),
        "eta_median_error": eta_median_error(events),
        "preemptions": preemptions(events),
        "steps_retrained_per_preemption": steps_retrained_per_preemption(events),
        "lost": lost(arrivals, events),
        "duplicate_trainings": duplicate_trainings(events),
        "duplicate_commits": duplicate_commits(commits),
    }
