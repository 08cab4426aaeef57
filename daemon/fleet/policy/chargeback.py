"""GPU-hours per team and priority class over a period, folded from the lifecycle events: what `adapterd usage` prints
for chargeback. Pure: no Kafka, no clock; the caller gives the events, the period and `now`.

A run holds its GPUs from its `started` event (its `slot` names them: "0,1" is two, "cpu" none) to its end: a terminal,
`retrying` or `preempted` event, or (a daemon stopped under it, which publishes nothing) the request's next `accepted`
event, where it is taken again; a run with no end yet counts up to `now`. As the fair share's `Usage`
(daemon/fleet/policy/usage.py) folds the same events, undecayed, and from `started` rather than `accepted`: chargeback
counts the time a job held its GPUs, not its model's loading before. A run's team and class are its request's latest
`accepted` event's (the fleet resolved them there), else its latest `queued` event's (an `accepted` older than what
was read).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from daemon.fleet.policy.usage import ENDS, gpus_of
from daemon.settings.fleet import team_of
from schemas import Accepted, Event, Queued, Rejected, Started

UNKNOWN_TEAM = "?"  # a run whose request's `accepted` and `queued` events were not read (older than the look-back)
GROUPINGS = ("team", "class")  # what `by` may name


@dataclass(frozen=True)
class Run:
    """One stretch of a request on its GPUs: `until` None while it runs."""

    request_id: str
    team: str
    priority_class: str | None
    gpus: int
    since: float
    until: float | None


@dataclass(frozen=True)
class Row:
    """One line of the report: a team, a class, or both (the one not grouped by is None and left out of the output)."""

    team: str | None
    priority_class: str | None
    gpu_hours: float
    jobs: int
    runs: int


def runs_of(events: Iterable[Event], now: float) -> list[Run]:
    """Every run the events tell, in the order each ended (those still running last). An event's time is bounded by
    `now`: a host whose clock runs ahead adds no time from the future."""
    owner: dict[str, tuple[str, str | None]] = {}  # request id → (team, class), from its latest accepted or queued
    accepted: set[str] = set()  # requests whose owner an `accepted` event said (a `queued` one does not override it)
    running: dict[str, Run] = {}
    done: list[Run] = []

    def end(request_id: str, at: float) -> None:
        run = running.pop(request_id, None)
        if run is not None:
            done.append(Run(run.request_id, run.team, run.priority_class, run.gpus, run.since, max(run.since, at)))

    for event in events:
        request_id = event.request_id
        if request_id is None:
            continue
        at = min(event.time.timestamp(), now)
        if isinstance(event, Accepted):
            end(request_id, at)  # a run with no end: its daemon stopped, and the request is taken again here
            owner[request_id] = (team_of(event.team), event.priority_class)
            accepted.add(request_id)
        elif isinstance(event, Queued) and request_id not in accepted:
            owner[request_id] = (event.team, event.priority_class)
        elif isinstance(event, Started):
            end(request_id, at)
            team, priority_class = owner.get(request_id, (UNKNOWN_TEAM, None))
            running[request_id] = Run(request_id, team, priority_class, gpus_of(event), at, None)
        elif isinstance(event, (*ENDS, Rejected)):
            end(request_id, at)
    return done + list(running.values())


def report(
    events: Iterable[Event], start: datetime, end: datetime, now: float, by: Sequence[str] = GROUPINGS
) -> list[Row]:
    """GPU-hours, jobs (requests) and runs in [start, end) per team and class (or what `by` names of them), sorted.
    A run straddling an edge counts its part inside; a run still going counts up to `now` or `end`, the earlier. A run
    inside the period counts as a run and its request as a job even with no GPU-hours (a CPU job, an instant's run)."""
    unknown = sorted(set(by) - set(GROUPINGS))
    if unknown or not by:
        raise ValueError(f"by: {', '.join(unknown) or 'nothing'} is not a grouping; one or both of team, class")
    lo, hi = start.timestamp(), min(end.timestamp(), now)
    seconds: dict[tuple[str | None, str | None], float] = {}
    jobs: dict[tuple[str | None, str | None], set[str]] = {}
    counted: dict[tuple[str | None, str | None], int] = {}
    for run in runs_of(events, now):
        until = now if run.until is None else run.until
        inside = run.since < hi and until > lo if until > run.since else lo <= run.since < hi
        if not inside:
            continue
        key = (run.team if "team" in by else None, run.priority_class if "class" in by else None)
        seconds[key] = seconds.get(key, 0.0) + run.gpus * max(0.0, min(until, hi) - max(run.since, lo))
        jobs.setdefault(key, set()).add(run.request_id)
        counted[key] = counted.get(key, 0) + 1
    return [
        Row(team, priority_class, seconds[(team, priority_class)] / 3600, len(jobs[(team, priority_class)]), runs)
        for (team, priority_class), runs in sorted(
            counted.items(), key=lambda item: (item[0][0] or "", item[0][1] or "")
        )
    ]
