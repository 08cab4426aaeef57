"""The ETA's error, measured by replaying a trace of arrivals through a simulated fleet of N slots that
decides as the real one does (`pick`, `start_order`, `etas`, the teams' caps): each request's ETA at its
arrival is compared with the start the simulation then gives it (`eta_error`), and so is each ETA it is
told while it waits, by the rule the hosts tell them by (daemon/fleet/policy/telling.py, looked at every
`TELL_EVERY_S` as the announcer does), each for as long as it was the latest (`eta_error_current`).
benchmarks.fleet replays its measured run (`arrivals_from_events`).

The simulated fleet starts a request the moment a slot is free (no dispatch delay) and preempts
nothing; a finished job's duration is learnt (`Trace.learn`) as a `succeeded` event would teach it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from daemon.fleet.policy.eta import etas, ranked
from daemon.fleet.policy.order import FleetJob, FleetRequest, Standing, pick, remaining_work, start_order
from daemon.fleet.policy.telling import Telling
from daemon.fleet.policy.usage import Durations, Usage, slots_of, trained_steps
from daemon.settings.fleet import PriorityClass, TeamShare
from schemas import Accepted, Event, Paused, Preempted, Retrying, Started, Succeeded

TELL_EVERY_S = 2.0  # how often the simulated fleet looks for what to tell again (daemon/fleet/announcer.py ANNOUNCE_S)


@dataclass(frozen=True)
class Arrival:
    """One request of a trace: when it arrives (seconds from the trace's start) and how long it really runs."""

    at: float
    duration_s: float
    method: str = "sft"
    model: str = "tiny"
    priority_class: str = "default"
    team: str = "default"
    gpus: int = 1
    request_id: str = ""  # empty: "r<its index in the trace>"
    steps: int | None = None  # its max_steps, when known: its expected duration scales with them


@dataclass(frozen=True)
class Trace:
    arrivals: tuple[Arrival, ...]
    slots: int = 1
    classes: tuple[PriorityClass, ...] = (PriorityClass(name="default"),)
    teams: Mapping[str, TeamShare] = field(default_factory=dict)
    # (method, model, seconds, steps or None): the durations known before the trace starts
    history: tuple[tuple[str, str, float, int | None], ...] = ()
    learn: bool = True  # a finished job's duration is learnt, as its succeeded event teaches the real fleet
    running_eta: bool = (
        False  # a running job reports its true remaining time (as its progress events' ETA); else it is estimated
    )


@dataclass(frozen=True)
class Outcome:
    request_id: str
    arrived: float
    eta_s: float | None  # the ETA it was given at arrival
    started: float | None  # when the simulation started it; None: never (more GPUs than the fleet has)
    told: tuple[
        tuple[float, float | None], ...
    ] = ()  # (when, ETA) of each `queued` event the rule sent it while it waited

    @property
    def error(self) -> float | None:
        """|ETA - actual wait| / max(actual wait, 1 s); None without an ETA or a start."""
        if self.eta_s is None or self.started is None:
            return None
        waited = self.started - self.arrived
        return abs(self.eta_s - waited) / max(waited, 1.0)


def replay(trace: Trace) -> list[Outcome]:
    """Each request of the trace, in arrival order, with its ETA at arrival and its simulated start."""
    arrivals = sorted(
        ((a if a.request_id else replace(a, request_id=f"r{i}")) for i, a in enumerate(trace.arrivals)),
        key=lambda a: a.at,
    )
    classes, teams = list(trace.classes), trace.teams
    durations, usage = Durations(), Usage()
    for method, model, seconds, steps in trace.history:
        _learn(durations, method, model, seconds, steps)
    by_id = {a.request_id: a for a in arrivals}
    waiting: list[FleetRequest] = []
    running: dict[str, tuple[float, FleetJob]] = {}  # request id → (its end, the job)
    eta_at_arrival: dict[str, float | None] = {}
    started: dict[str, float] = {}
    telling = Telling()
    told: dict[str, list[tuple[float, float | None]]] = {a.request_id: [] for a in arrivals}

    def free_slots() -> int:
        return trace.slots - sum(job.gpus for _, job in running.values())

    def seen(now: float) -> list[FleetJob]:
        """The running jobs as the fleet sees them: with their true remaining time as their ETA, or without one but
        with the steps they have left (as their progress events say), when their steps are known."""
        return [
            replace(job, eta_s=end - now)
            if trace.running_eta
            else replace(job, steps_left=left(job.request_id, end, now))
            for end, job in running.values()
        ]

    def left(request_id: str, end: float, now: float) -> int | None:
        arrival = by_id[request_id]
        if arrival.steps is None or arrival.duration_s <= 0:
            return None
        return math.ceil(arrival.steps * max(0.0, end - now) / arrival.duration_s)

    def dispatch(now: float) -> None:
        while waiting:
            ahead = remaining_work(seen(now), durations, now)
            head = pick(
                waiting,
                Standing(classes, teams, usage.slot_seconds(now), usage.running(), ahead, durations),
                free=free_slots(),
            )
            if head is None:
                return
            waiting.remove(head)
            started[head.request_id] = now
            running[head.request_id] = (
                now + by_id[head.request_id].duration_s,
                FleetJob(
                    head.request_id,
                    head.priority_class,
                    head.team,
                    now,
                    head.method,
                    head.model,
                    gpus=head.gpus,
                ),
            )
            usage.start(head.request_id, head.team, now, slots=head.gpus)

    def estimated(now: float) -> tuple[list[FleetRequest], dict[str, float | None]]:
        """The waiting requests in the order they are expected to start, and each one's ETA, as the hosts work them
        out."""
        jobs = seen(now)
        ahead = remaining_work(jobs, durations, now)
        order = start_order(waiting, Standing(classes, teams, usage.slot_seconds(now), ahead=ahead, pace=durations))
        return order, etas(order, jobs, trace.slots, durations, now, teams)

    def tell(now: float) -> None:
        """The `queued` events the hosts' rule sends now, to the requests still waiting."""
        for request, place, said in telling.due(ranked(*estimated(now)), now, "replay"):
            telling.heard(request.request_id, place, said, now, "replay")
            told[request.request_id].append((now, said))

    index, look = 0, math.inf
    while index < len(arrivals) or running:
        next_end = min((end for end, _ in running.values()), default=math.inf)
        if look < min(next_end, arrivals[index].at if index < len(arrivals) else math.inf):
            now = look
        elif index < len(arrivals) and arrivals[index].at < next_end:
            arrival = arrivals[index]
            index += 1
            now = arrival.at
            waiting.append(
                FleetRequest(
                    arrival.request_id,
                    arrival.priority_class,
                    arrival.team,
                    now,
                    arrival.method,
                    arrival.model,
                    arrival.gpus,
                    steps=arrival.steps,
                )
            )
            eta_at_arrival[arrival.request_id] = estimated(now)[1][arrival.request_id]
        else:
            now = next_end
            for request_id in [r for r, (end, _) in running.items() if end == now]:
                _, job = running.pop(request_id)
                usage.end(request_id, now)
                if trace.learn:
                    _learn(durations, job.method, job.model, by_id[request_id].duration_s, by_id[request_id].steps)
        dispatch(now)
        if waiting:
            tell(now)
        look = now + TELL_EVERY_S if waiting else math.inf
    return [
        Outcome(a.request_id, a.at, eta_at_arrival[a.request_id], started.get(a.request_id), tuple(told[a.request_id]))
        for a in arrivals
    ]


def _learn(durations: Durations, method: str, model: str, seconds: float, steps: int | None) -> None:
    """A finished job's duration, and with its steps its pace (the whole slot-time counted as steps: the trace
    does not say how much of it was outside training)."""
    durations.add(method, model, seconds, steps=steps, training_s=seconds if steps else None)


def eta_error(trace: Trace) -> float:
    """The median relative error of the ETAs given at arrival (|ETA - actual wait| / max(actual wait, 1 s)),
    over the requests that were given one; NaN when none was (nothing was known to estimate from)."""
    errors = [error for outcome in replay(trace) if (error := outcome.error) is not None]
    return statistics.median(errors) if errors else math.nan


def eta_error_current(trace: Trace) -> float:
    """The time-weighted median relative error of the ETA each waiting request was last told (`Outcome.told`): each
    one's |ETA - the wait from its telling to the start| / max(that wait, 1 s), weighted by the seconds until the next
    telling or the start (as benchmarks/fleet_waits.py `eta_error_current_median` reads a run's events); NaN when
    no request was told an ETA."""
    weighted = []
    for outcome in replay(trace):
        if outcome.started is None:
            continue
        for n, (at, eta) in enumerate(outcome.told):
            until = outcome.told[n + 1][0] if n + 1 < len(outcome.told) else outcome.started
            if eta is not None and until > at:
                wait = outcome.started - at
                weighted.append((abs(eta - wait) / max(wait, 1.0), until - at))
    total, reached = sum(weight for _, weight in weighted), 0.0
    for error, weight in sorted(weighted):
        reached += weight
        if reached >= total / 2:
            return error
    return math.nan


def arrivals_from_events(events: Iterable[Event]) -> tuple[Arrival, ...]:
    """A measured run's requests as a trace's arrivals, read from its events, in arrival order, times from the
    first: each request that succeeded (a duplicate left out), arriving its `total` duration before its
    succeeded event (or at its first `accepted` event, if earlier: a request preempted and queued again counts
    from its first arrival, less its first wait), of the method and model it names, the class and team its
    `accepted` event named ("default" on a host without classes), the GPUs its `started` event named and the steps
    it trained (its metrics' train_runtime x train_steps_per_second).
    Its duration is its slot-time: each earlier attempt's stretch from `accepted` to `preempted` or
    `retrying`, and the last one's `total` less its queue and push."""
    accepted: dict[str, Accepted] = {}
    first_accepted: dict[str, float] = {}
    earlier: dict[str, float] = {}
    gpus: dict[str, int] = {}
    done: list[tuple[float, Arrival]] = []
    for event in events:
        request_id = event.request_id
        if request_id is None:
            continue
        if isinstance(event, Accepted):
            accepted[request_id] = event
            first_accepted.setdefault(request_id, event.time.timestamp())
        elif isinstance(event, Started):
            gpus[request_id] = slots_of(event)
        elif isinstance(event, Preempted | Retrying | Paused) and request_id in accepted:
            earlier[request_id] = (
                earlier.get(request_id, 0.0) + (event.time - accepted[request_id].time).total_seconds()
            )
        elif (
            isinstance(event, Succeeded)
            and not event.duplicate
            and "total" in event.durations_s
            and request_id in accepted
        ):
            times, start = event.durations_s, accepted[request_id]
            trained = trained_steps(event.metrics)
            steps = round(trained) if trained is not None else None
            last = max(0.0, times["total"] - times.get("queue", 0.0) - times.get("push", 0.0))
            arrived = min(event.time.timestamp() - times["total"], first_accepted[request_id])
            done.append(
                (
                    arrived,
                    Arrival(
                        0.0,
                        earlier.get(request_id, 0.0) + last,
                        event.method,
                        event.base_model,
                        start.priority_class or "default",
                        start.team or "default",
                        gpus.get(request_id, 1),
                        request_id,
                        steps,
                    ),
                )
            )
    first = min((at for at, _ in done), default=0.0)
    return tuple(replace(arrival, at=at - first) for at, arrival in sorted(done, key=lambda pair: pair[0]))
