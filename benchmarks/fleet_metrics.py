"""The fleet benchmark's figures (benchmarks/fleet.py), as pure functions of what the fleet said.

Inputs are the lifecycle events, each reduced to a `Seen`, the requests as they were published (`Arrival`),
each host's slots, the classes highest first, the teams' weights and the Hub's commits per request
(benchmarks/fleet_timeline.py reduces them and cuts the run into slices; benchmarks/fleet_shares.py works out
the two share figures). Nothing here reads a clock or a broker, so each figure is unit-tested on constructed
event lists (tests/test_fleet_metrics.py). Every slot here fits every request (the benchmark's slots are
alike CPU slots), so a request waiting anywhere could use any free slot.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from benchmarks.fleet_shares import fair_share_error, order_share_error
from benchmarks.fleet_timeline import RELEASES, Arrival, Seen, first_step_at, holds, run_end, terminal_at, timeline
from benchmarks.fleet_waits import MIN_WAIT_S, eta_error_current_median, unneeded_preemptions


def idle_share(arrivals: Sequence[Arrival], events: Sequence[Seen], slots: dict[str, int], end: float) -> float:
    """Slot-seconds a slot was free while a request waited anywhere, over all slot-seconds from
    the first arrival to `end`."""
    slices = timeline(arrivals, events, end)
    total = sum(slots.values()) * (end - min(a.at for a in arrivals))
    idle = 0.0
    for piece in slices:
        free = sum(max(0, count - piece.busy.get(host, 0)) for host, count in slots.items())
        idle += min(free, len(piece.waiting)) * (piece.end - piece.start)
    return idle / total if total > 0 else 0.0


def greedy_schedule(
    arrivals: Sequence[Arrival], durations: dict[str, float], slots: int, classes: Sequence[str]
) -> dict[str, float]:
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


def greedy_makespan(
    arrivals: Sequence[Arrival], durations: dict[str, float], slots: int, classes: Sequence[str]
) -> float:
    """The greedy schedule's makespan: its first arrival to its last finish."""
    starts = greedy_schedule(arrivals, durations, slots, classes)
    if not starts:
        return 0.0
    first = min(a.at for a in arrivals if a.request_id in starts)
    return max(start + durations[request_id] for request_id, start in starts.items()) - first


def makespan_ratio(
    arrivals: Sequence[Arrival], events: Sequence[Seen], slots: dict[str, int], classes: Sequence[str], end: float
) -> float | None:
    """The run's makespan (first arrival to `end`) over the greedy schedule's of the same measured job durations
    (each request's slot-time, every hold of it added up) on the same number of slots; None when nothing ran."""
    durations: dict[str, float] = defaultdict(float)
    for hold in holds(events, end):
        durations[hold.request_id] += hold.end - hold.start
    ideal = greedy_makespan(arrivals, dict(durations), sum(slots.values()), classes)
    actual = end - min(a.at for a in arrivals)
    return actual / ideal if ideal > 0 else None


def percentile(values: Sequence[float], share: float) -> float:
    """The nearest-rank percentile (the value at rank ceil(share·n))."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def start_p95(arrivals: Sequence[Arrival], events: Sequence[Seen], priority_class: str) -> float | None:
    """The 95th percentile of arrival to first step over the class's requests that trained; None when none did."""
    reached = first_step_at(events)
    waits = [
        reached[a.request_id] - a.at for a in arrivals if a.priority_class == priority_class and a.request_id in reached
    ]
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
        start = next((e.at for e in ordered[n + 1 :] if e.request_id == event.request_id and e.type == "started"), None)
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
            reached = max(
                (e.step or 0 for e in ordered[:n] if e.request_id == event.request_id and e.type == "progress"),
                default=0,
            )
        resumed = next((e for e in ordered[n + 1 :] if e.request_id == event.request_id and e.type == "started"), None)
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
            if (
                event.type == "progress"
                and event.stage == "train"
                and event.step is not None
                and event.step == event.total_steps
            ):
                training.reached_end = True
            if (
                event.type in RELEASES
            ):  # it stopped there: the host's later events of it (its next `accepted`) are another's
                found.append(opened.pop(key))
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
        overlap = any(later.start < earlier.last for n, earlier in enumerate(runs) for later in runs[n + 1 :])
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


def figures(
    arrivals: Sequence[Arrival],
    events: Sequence[Seen],
    slots: dict[str, int],
    classes: Sequence[str],
    weights: dict[str, float],
    commits: dict[str, int],
    urgent_class: str = "urgent",
    end: float | None = None,
    caps: dict[str, int] | None = None,
) -> dict[str, object]:
    """Every figure of the FLEET line, in its order, over the run from the first arrival to `end` (unset: the
    requests' last event, which is where the run ends when every one of them ended). `caps`: the teams' `max_slots`,
    which the share figures count (a team wants no more slots than its cap)."""
    mine = {arrival.request_id for arrival in arrivals}
    events = [event for event in events if event.request_id in mine]
    if end is None:
        end = run_end(events) if events else max(a.at for a in arrivals)
    return {
        "urgent_start_p95_s": start_p95(arrivals, events, urgent_class),
        "idle_share": idle_share(arrivals, events, slots, end),
        "makespan_ratio": makespan_ratio(arrivals, events, slots, classes, end),
        "fair_share_error": fair_share_error(arrivals, events, weights, end, caps),
        "order_share_error": order_share_error(arrivals, events, slots, classes, weights, end, caps),
        "eta_median_error": eta_median_error(events),
        "eta_error_current_median": eta_error_current_median(arrivals, events),
        "preemptions": preemptions(events),
        "unneeded_preemptions": unneeded_preemptions(arrivals, events, classes),
        "steps_retrained_per_preemption": steps_retrained_per_preemption(events),
        "lost": lost(arrivals, events),
        "duplicate_trainings": duplicate_trainings(events),
        "duplicate_commits": duplicate_commits(commits),
    }
