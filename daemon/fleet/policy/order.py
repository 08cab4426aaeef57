"""The fleet's order, decided by pure functions: which waiting request a free slot takes, and which
running job a higher class stops. No Kafka and no clock here: the callers (the dispatcher, `jobs`,
the benchmark's replay) pass in what they read, and `now`.

The rules (docs/architecture.md, "The fleet's order"):
- class first, in the operator's order (highest first);
- within a class, fair share: again and again the team with the least (decayed slot-seconds + the rest
  of its running jobs + the expected work already placed ahead of it) / weight; a team at its `max_slots` cap is skipped
  while a team below its cap waits (a cap is hard: `pick` never gives such a team a slot);
- then arrival. A share left idle is lent: a team alone waiting gets every slot up to its cap.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from daemon.admission.gpu_kinds import GpuNeed
from daemon.fleet.policy.usage import Durations, Pace, Paced
from daemon.settings.fleet import PriorityClass, TeamShare, team_of
from schemas import RequestBase

# The slot-seconds a waiting request of unknown length counts for in the fair share, when no job
# of any method has succeeded yet: only the ratio between teams matters then, not this figure.
DEFAULT_WORK_S = 600.0

NO_SHARE = TeamShare()  # a team the operator did not list: weight 1, no cap


@dataclass(frozen=True)
class FleetRequest:
    """A request waiting anywhere in the fleet: not yet read from its class's queue, or read and not yet started."""

    request_id: str
    priority_class: str
    team: str
    arrived: float  # epoch seconds: its record's timestamp
    method: str
    model: str
    gpus: int = 1
    key: object = None  # the caller's handle (a TopicPartition, a record), passed through untouched
    steps: int | None = None  # its max_steps, when it names them: its expected duration scales with them
    need: GpuNeed | None = None  # the GPUs' kind or memory it asks for (resources.gpu_kind...); None: any
    hosts: int = 1  # the hosts its GPUs span (resources.hosts): more than one, it runs on a Ray cluster if anywhere


@dataclass(frozen=True)
class FleetJob:
    """A job running somewhere in the fleet."""

    request_id: str
    priority_class: str
    team: str
    started: float  # epoch seconds
    method: str
    model: str
    eta_s: float | None = None  # the job's own ETA (its last progress event), seconds from `now`
    preemptible: bool = False  # the job may be stopped now (its class allows it, and it is training)
    preemptions: int = 0
    steps_since_checkpoint: int | None = None  # work a preemption would lose; None: unknown, counted as the worst
    steps_left: int | None = None  # its last progress event's total_steps less its step; None before one
    step_s: float | None = None  # its pace now: its last progress event's ETA over its steps left; None before one says
    host: str = ""
    key: object = None
    gpus: int = 1
    # Run on the host's Ray cluster (`[ray]`): its GPUs are the cluster's, none of its host's, though its team's.
    on_ray: bool = False


def waiting_for(request: RequestBase, priority_class: str, arrived: float, key: object = None) -> FleetRequest:
    """A decoded request as the fleet's order weighs it: its class, team, arrival, method, model, GPUs and steps."""
    return FleetRequest(
        request.request_id,
        priority_class,
        team_of(request.team),
        arrived,
        request.method,
        request.model.id,
        request.resources.gpus,
        key=key,
        steps=request.training.max_steps,
        need=GpuNeed.of(request.resources),
        hosts=request.resources.hosts,
    )


def share_of(team: str, teams: Mapping[str, TeamShare]) -> TeamShare:
    return teams.get(team, NO_SHARE)


def paced(durations: Durations, running: Iterable[FleetJob]) -> Paced:
    """`durations` read with the running jobs' paces now (`FleetJob.step_s`): what every reading of the order takes."""
    paces: dict[tuple[str, str], list[float]] = {}
    for job in running:
        if job.step_s is not None:
            paces.setdefault((job.method, job.model), []).append(job.step_s)
    return Paced(durations, paces)


def expected_work(request: FleetRequest, durations: Pace | None) -> float:
    """The slot-seconds a waiting request is expected to take: its expected duration times its GPUs."""
    expected = durations.expected(request.method, request.model, request.steps) if durations is not None else None
    return (DEFAULT_WORK_S if expected is None else expected) * request.gpus


def time_left(job: FleetJob, durations: Pace | None, now: float) -> float | None:
    """The seconds a running job is expected to hold its slots from `now`, or None when nothing says: its own ETA
    (`eta_s`, from its progress), else its steps left (from its progress, or its `accepted` event's max_steps) at the
    step's pace of its method and model (`durations`: finished jobs', taken with the running jobs' where `paced`),
    else its expected duration less the time it has run."""
    if job.eta_s is not None:
        return max(0.0, job.eta_s)
    step_s = durations.step_s(job.method, job.model) if durations is not None and job.steps_left is not None else None
    if job.steps_left is not None and step_s is not None:
        return step_s * job.steps_left
    expected = durations.expected(job.method, job.model) if durations is not None else None
    return None if expected is None else max(0.0, expected - (now - job.started))


def remaining_work(running: list[FleetJob], durations: Pace | None, now: float) -> dict[str, float]:
    """The slot-seconds each team's running jobs are still expected to take (`time_left`; unknown: DEFAULT_WORK_S
    less the time it has run), times its GPUs. The fair share counts it as work placed ahead: without it the
    slots that free together all go to whichever team leads, since a job just started has no slot-time yet."""
    ahead: dict[str, float] = {}
    for job in running:
        left = time_left(job, durations, now)
        if left is None:
            left = max(0.0, DEFAULT_WORK_S - (now - job.started))
        ahead[job.team] = ahead.get(job.team, 0.0) + left * job.gpus
    return ahead


@dataclass(frozen=True)
class Standing:
    """What the fleet's order weighs besides the requests themselves: the operator's classes (highest first) and teams'
    shares, each team's decayed slot-seconds (`Usage.slot_seconds`), the slots each holds now (`Usage.running`), the
    slot-seconds its running jobs still have to go (`remaining_work`), and a step's pace (`paced`; None: every
    request counts for DEFAULT_WORK_S)."""

    classes: Sequence[PriorityClass]
    teams: Mapping[str, TeamShare] = field(default_factory=dict)
    usage: Mapping[str, float] = field(default_factory=dict)
    holding: Mapping[str, int] = field(default_factory=dict)
    ahead: Mapping[str, float] = field(default_factory=dict)
    pace: Pace | None = None


def fleet_order(waiting: list[FleetRequest], standing: Standing) -> list[FleetRequest]:
    """Every waiting request in the order the fleet starts them (see the module's rules), as `standing` weighs them.
    A request of a class not in its classes (one the operator since removed) goes last."""
    classes, teams = standing.classes, standing.teams
    rank = {c.name: index for index, c in enumerate(classes)}
    groups: dict[int, dict[str, deque[FleetRequest]]] = {}
    for request in sorted(waiting, key=lambda w: (rank.get(w.priority_class, len(classes)), w.arrived, w.request_id)):
        groups.setdefault(rank.get(request.priority_class, len(classes)), {}).setdefault(request.team, deque()).append(
            request
        )
    spent = dict(standing.usage)  # each team's slot-seconds, growing with the work placed ahead
    for team, seconds in standing.ahead.items():
        spent[team] = spent.get(team, 0.0) + seconds
    holding = dict(standing.holding)  # each team's slots, growing with the requests placed ahead
    order: list[FleetRequest] = []

    def entry(team: str, queue: deque[FleetRequest]) -> tuple[float, float, str]:
        return spent.get(team, 0.0) / share_of(team, teams).weight, queue[0].arrived, team

    for _, queues in sorted(groups.items()):
        # The teams below their caps compete first; a team reaching its cap stays at it (holding only grows),
        # so its requests wait until no team below its cap has any left, then the capped ones compete alike.
        capped = [team for team in queues if at_cap(team, holding, teams)]
        contending = [entry(team, queue) for team, queue in queues.items() if team not in capped]
        heapq.heapify(contending)
        only_capped = False
        while contending or capped:
            if not contending:
                contending, capped, only_capped = [entry(team, queues[team]) for team in capped], [], True
                heapq.heapify(contending)
            _, _, team = heapq.heappop(contending)
            request = queues[team].popleft()
            order.append(request)
            spent[team] = spent.get(team, 0.0) + expected_work(request, standing.pace)
            holding[team] = holding.get(team, 0) + request.gpus
            if not queues[team]:
                continue
            if not only_capped and at_cap(team, holding, teams):
                capped.append(team)
            else:
                heapq.heappush(contending, entry(team, queues[team]))
    return order


def start_order(waiting: list[FleetRequest], standing: Standing) -> list[FleetRequest]:
    """The waiting requests in the order they are expected to start, for their places and ETAs
    (daemon/fleet/policy/eta.py): the fleet's order with no team deferred for its cap. `fleet_order` puts a team that
    reaches its `max_slots` behind every other team of its class, which is what the next free slot does (`pick`); but
    once one of its jobs ends the team competes again by its weight, so its later requests start long before the end of
    the class (told by the deferred order, a capped team's requests were told 85 to 117 s and started after 34 to 77 s).
    `etas` holds each to its cap instead: it starts when enough of its team's jobs end, the slots freeing meanwhile
    going to those behind it."""
    uncapped = {name: share.model_copy(update={"max_slots": None}) for name, share in standing.teams.items()}
    return fleet_order(waiting, replace(standing, teams=uncapped, holding={}))


def at_cap(team: str, holding: Mapping[str, int], teams: Mapping[str, TeamShare], need: int = 1) -> bool:
    cap = share_of(team, teams).max_slots
    return cap is not None and holding.get(team, 0) + need > cap


def pick(heads: list[FleetRequest], standing: Standing, *, free: int | None = None) -> FleetRequest | None:
    """What one free slot takes among the requests it can see (a dispatcher: its queues' heads): the first of
    the fleet's order among those that fit. A request fits when its team stays within its cap with it, and,
    given `free` (the host's free slots), when it needs no more GPUs than that. None: nothing it sees may start."""
    fits = [
        h
        for h in heads
        if (free is None or h.gpus <= free) and not at_cap(h.team, standing.holding, standing.teams, h.gpus)
    ]
    order = fleet_order(fits, standing)
    return order[0] if order else None


def victim(
    head: FleetRequest,
    running: list[FleetJob],
    classes: list[PriorityClass],
    min_run_s: float,
    max_count: int,
    now: float,
    *,
    free: int = 0,
) -> FleetJob | None:
    """The running job `head` (a waiting request that fits no free slot) stops at its checkpoint, or None.

    Only a job of a class lower than head's, of a class the operator made preemptible and itself
    `preemptible` (both: the class allows it, and the caller knows the job can stop at a checkpoint now),
    that has run at least `min_run_s`, been preempted fewer than `max_count` times, and frees enough GPUs
    for head with the host's `free` ones (a head of several GPUs stops no job of one). Among them the one
    that loses the least work (`steps_since_checkpoint`; unknown counts as the most), then the lowest
    class, then the latest started (the one that has run the least, as Kueue chooses)."""
    rank = {c.name: index for index, c in enumerate(classes)}
    allowed = {c.name for c in classes if c.preemptible}
    if head.priority_class not in rank:
        return None
    candidates = [
        job
        for job in running
        if job.preemptible
        and job.priority_class in allowed
        and rank[job.priority_class] > rank[head.priority_class]
        and now - job.started >= min_run_s
        and job.preemptions < max_count
        and job.gpus + free >= head.gpus
    ]
    if not candidates:
        return None
    return min(
        candidates,
        key=lambda job: (
            float("inf") if job.steps_since_checkpoint is None else job.steps_since_checkpoint,
            -rank[job.priority_class],
            -job.started,
            job.request_id,
        ),
    )
