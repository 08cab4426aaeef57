"""What the fleet said, as the fleet benchmark's figures read it (benchmarks/fleet_metrics.py): each lifecycle
event reduced to a `Seen` (its type, request, time and host, and the few fields a figure reads), the requests
as they were published (`Arrival`: the record's timestamp, the benchmark's class and team for it), each job's
`Hold` on a slot, and the run cut into `Slice`s in which nothing changed. Pure: no clock, no broker.

A job holds a slot from its `accepted` to its request's next `succeeded`, `failed`, `cancelled`,
`preempted` or `retrying` from the same host (an occupancy with no end holds it to the run's end), a
`succeeded` less its push (durations_s): the daemon gives the slot to the next request when the job's
child exits, while the adapter is pushed; a request waits from its arrival, and again after a preemption
or a retry, until its next `accepted`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schemas import Event

TERMINAL = frozenset({"succeeded", "failed", "cancelled", "rejected"})
# What ends a job's hold on its slot (a rejected request never held one).
RELEASES = frozenset({"succeeded", "failed", "cancelled", "preempted", "retrying"})


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
    by: str | None = None  # preempted: the request that took the slot


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
    if event.type == "preempted":
        return replace(base, step=event.step, by=event.by)
    if event.type == "checkpoint":
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
    cuts = sorted(
        {start, end} | {a.at for a in arrivals} | {h.start for h in found} | {h.end for h in found} | set(done.values())
    )
    cuts = [t for t in cuts if start <= t <= end]
    slices = []
    for left, right in zip(cuts, cuts[1:], strict=False):
        middle = (left + right) / 2
        now = [hold for hold in found if hold.start <= middle < hold.end]
        held = {hold.request_id for hold in now}
        busy: dict[str, int] = defaultdict(int)
        for hold in now:
            busy[hold.host] += 1
        waiting = [
            a
            for a in arrivals
            if a.at <= middle and a.request_id not in held and done.get(a.request_id, math.inf) > middle
        ]
        slices.append(Slice(left, right, dict(busy), waiting, [by_id[request_id] for request_id in sorted(held)]))
    return slices


def first_step_at(events: Sequence[Seen]) -> dict[str, float]:
    """When each request reached its first optimizer step (its first training `progress`; its
    `started` if it sent none)."""
    progress: dict[str, float] = {}
    started: dict[str, float] = {}
    for event in sorted(events, key=lambda e: e.at):
        if event.type == "progress" and event.stage == "train":
            progress.setdefault(event.request_id, event.at)
        elif event.type == "started":
            started.setdefault(event.request_id, event.at)
    return {**started, **progress}
