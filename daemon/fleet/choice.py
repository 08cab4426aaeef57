"""What a host with room takes next, and which of its jobs a waiting request of a higher class may preempt.

The rules are the fleet's order (classes first, then the teams' fair share, then
arrival); this module says them in terms of what the dispatcher holds: the first waiting record of each
queue partition (`Head`) and this host's running jobs (`Running`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiokafka import TopicPartition

from daemon.fleet_config import team_of
from daemon.kafka.records import Record
from daemon.settings import Settings
from schemas import RequestBase


@dataclass(frozen=True)
class Running:
    """A job running on this host, as the fleet's rules see it."""

    request_id: str
    priority_class: str
    team: str
    started: float  # time.time() its job started
    method: str
    model: str
    preemptible: bool
    preemptions: int
    steps_since_checkpoint: int | None  # None: unknown (counts as the most work lost)
    eta_s: float | None = None
    key: TopicPartition | None = None  # its claims partition


@dataclass(eq=False)
class Head:
    """The first waiting record of a queue partition this host holds."""

    record: Record
    tp: TopicPartition
    queue: str  # the class whose topic it was read from
    group: str  # that topic's consumer group
    request: RequestBase | None  # None: it does not decode (claimed as it is; intake rejects it)
    priority_class: str
    due: float | None = None  # a retry's due time
    moves_to: str | None = None  # the topic of the class it names, when not this one
    not_due_behind: bool = False  # a retry not yet due with requests behind it
    preemptions: int = 0

    @property
    def request_id(self) -> str:
        return self.request.request_id if self.request is not None else f"{self.tp.topic}/{self.tp.partition}@{self.record.offset}"

    @property
    def team(self) -> str:
        return team_of(self.request.team if self.request is not None else None)

    @property
    def arrived(self) -> float:
        return self.record.timestamp / 1000

    @property
    def gpus(self) -> int:
        return self.request.resources.gpus if self.request is not None else 0

    def not_yet_due(self, now: float) -> bool:
        return self.due is not None and self.due > now


def class_rank(settings: Settings) -> dict[str, int]:
    """0 for the highest class."""
    return {c.name: i for i, c in enumerate(settings.priority_classes)}


def choose(heads: list[Head], running: list[Running], settings: Settings, room: int) -> Head | None:
    """The head the next free slot takes: one that does not decode first (it only needs rejecting), then
    the highest class, then the team furthest below its share (its running jobs over its weight, a team at
    its cap passed over), then the earliest arrival."""
    if not heads:
        return None
    rank = class_rank(settings)
    counts: dict[str, int] = {}
    for job in running:
        counts[job.team] = counts.get(job.team, 0) + 1

    def share(head: Head) -> float:
        team = settings.teams.get(head.team)
        return counts.get(head.team, 0) / (team.weight if team is not None else 1.0)

    def capped(head: Head) -> bool:
        team = settings.teams.get(head.team)
        return team is not None and team.max_slots is not None and counts.get(head.team, 0) >= team.max_slots

    allowed = [h for h in heads if h.request is None or not capped(h)]
    if not allowed:
        return None
    return min(allowed, key=lambda h: (h.request is not None, rank.get(h.priority_class, len(rank)), share(h), h.arrived))


def preemption_for(priority_class: str, running: list[Running], settings: Settings, now: float, head: Head | None = None) -> Running | None:
    """The job a waiting request of `priority_class` may stop to take its slot: preemptible, of a lower class,
    run at least `preempt_min_run_s`, preempted fewer than `preempt_max_count` times; of those the one that
    loses the least work (steps since its last checkpoint), then the lowest class, then the latest started."""
    rank = class_rank(settings)
    mine = rank.get(priority_class)
    if mine is None:
        return None
    candidates = [
        job for job in running
        if job.preemptible and rank.get(job.priority_class, -1) > mine and now - job.started >= settings.preempt_min_run_s
        and job.preemptions < settings.preempt_max_count
    ]
    if head is not None and head.request is not None:
        candidates = [job for job in candidates if head.gpus <= 1]  # a job of several GPUs waits for them to free
    if not candidates:
        return None
    worst = 1 << 62
    return min(candidates, key=lambda job: (job.steps_since_checkpoint if job.steps_since_checkpoint is not None else worst,
                                            -rank[job.priority_class], -job.started))
