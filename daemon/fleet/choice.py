"""The first waiting records of a queue partition this host holds (`Head`), as the fleet's rules see them:
a `FleetRequest` request of daemon/fleet/policy/order.py, whose key is the head itself; and how a record read from a
class's queue becomes one (`HeadReader`): decoded as intake decodes, judged by the same grants and size rule,
with its retry state and the fleet's arrival (`Arrivals`).

The arrival: when a request of a class's queue arrived, as the fleet's order takes it (issue 61): never the
producer's own clock, which it sets to anything (a record backdated to 1970 would go first).

- A copy a host wrote (moved, written again, retried, sent back when preempted) carries the arrival the
  fleet signed (daemon/kafka/queue_seal.py): trusted only when its signature verifies, for this topic and class.
- Otherwise, on a class topic that `adapterd topics` made (`message.timestamp.type=LogAppendTime`,
  daemon/kafka/admin/topics.py), the broker's append time: when the fleet first had it.
- Otherwise (a topic made by hand, CreateTime), the time this host first read the record.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from aiokafka import TopicPartition

from daemon import decoding
from daemon.admission.gpu_kinds import fleet_rejection
from daemon.admission.grants import Grants
from daemon.fleet.policy.order import FleetRequest, waiting_for
from daemon.intake import internal_rejection
from daemon.kafka.queue_seal import QueueSeal, Unsealed
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.kafka.unreadable import UnreadableRecord, rejection_of
from daemon.settings import Settings
from daemon.settings.fleet import team_of
from schemas import Rejection, RequestBase

LOG_APPEND_TIME = 1  # a record's `timestamp_type` when the broker stamped it (aiokafka's ConsumerRecord)
REMEMBERED = 65_536  # records whose first read this host remembers, across its re-reads of a partition


class Queue(Protocol):
    """What a head keeps of the class's queue it was read from (daemon/fleet/queues.py `ClassQueue`)."""

    name: str
    group: str
    generation: int


@dataclass(eq=False)
class Head:
    record: Record
    tp: TopicPartition
    queue: str  # the class whose topic it was read from
    group: str  # that topic's consumer group
    request: RequestBase | None  # None: it does not decode (rejected where it is: `rejection`)
    priority_class: str
    due: float | None = None  # a retry's due time
    moves_to: str | None = None  # the topic of the class it names, when not this one
    preemptions: int = 0
    # Rejected where it is, costing no claim: it does not decode, is too large for the copies a move makes, the
    # client cannot read it (daemon/kafka/unreadable.py), or its team or class is not granted to its writer
    # (daemon/admission/grants.py), never ordered as it.
    rejection: Rejection | None = None
    generation: int = 0  # its queue's rebalances when it was read (ClassQueue.generation)
    seen_at: float = field(default_factory=time.time)
    arrived_ms: int | None = None  # when it arrived (`Arrivals`); None: when this host read it

    @property
    def request_id(self) -> str:
        return (
            self.request.request_id
            if self.request is not None
            else f"{self.tp.topic}/{self.tp.partition}@{self.record.offset}"
        )

    @property
    def team(self) -> str:
        return team_of(self.request.team if self.request is not None else None)

    @property
    def arrival_ms(self) -> int:
        return self.arrived_ms if self.arrived_ms is not None else int(self.seen_at * 1000)

    @property
    def arrived(self) -> float:
        return self.arrival_ms / 1000

    def not_yet_due(self, now: float) -> bool:
        return self.due is not None and self.due > now

    def waiting(self) -> FleetRequest:
        if self.request is not None:
            return waiting_for(self.request, self.priority_class, self.arrived, key=self)
        return FleetRequest(self.request_id, self.priority_class, self.team, self.arrived, "", "", 1, key=self)


@dataclass(frozen=True)
class HeadReader:
    """A record of a class's queue as a `Head`: decoded as intake decodes it; rejected where it is when it does not
    decode, is too large for the copies a move makes, names a team or class not granted to its writer (never ordered
    as it), or asks for GPUs no kind of the fleet's has (daemon/admission/gpu_kinds.py); to be moved when it names
    another class that has a topic."""

    settings: Settings
    grants: Grants
    retries: RetrySigner
    arrivals: Arrivals

    async def read(self, queue: Queue, tp: TopicPartition, record: Record) -> Head:
        """The record as a head, decoded as intake decodes it (daemon/decoding.py: a large one in a worker thread, so
        a window of 1 MB records never holds the loop) and its writer's grant checked as intake checks it."""
        try:
            decoded = await decoding.decoded(record, self.settings.max_message_bytes)
        except Exception as exc:  # a bug of ours met by this record: dead-lettered, as intake would
            decoded = internal_rejection(record, exc)
        request = decoded if isinstance(decoded, RequestBase) else None
        priority_class = (request.priority_class if request is not None else None) or queue.name
        refused: Rejection | None = None
        if request is not None:
            refused, _ = await decoding.checked(
                record, self.grants.refusal, request, record.value, record.headers, priority_class
            )
        rejection = decoded if isinstance(decoded, Rejection) else refused or fleet_rejection(request, self.settings)
        moves_to = None
        if request is not None and priority_class != queue.name and priority_class in self.settings.class_topics:
            moves_to = self.settings.class_topics[priority_class]
        return Head(
            record=record,
            tp=tp,
            queue=queue.name,
            group=queue.group,
            request=request,
            priority_class=priority_class,
            generation=queue.generation,
            due=self.retries.read(record).due,
            moves_to=None if rejection else moves_to,
            preemptions=self.retries.preemptions(record),
            rejection=rejection,
            arrived_ms=self.arrivals.of(queue.name, record),
        )

    @staticmethod
    def unreadable(queue: Queue, tp: TopicPartition, record: UnreadableRecord, exc: BaseException) -> Head:
        """A record the client could not read, known by its offset: rejected where it is, as intake rejects one."""
        return Head(
            record=record,
            tp=tp,
            queue=queue.name,
            group=queue.group,
            request=None,
            priority_class=queue.name,
            generation=queue.generation,
            rejection=rejection_of(record, exc),
        )


class Arrivals:
    """Each queue record's arrival in milliseconds since the epoch (`of`)."""

    def __init__(self, seal: QueueSeal, clock: Callable[[], float] = time.time) -> None:
        self.seal = seal
        self.clock = clock
        self.first_read: OrderedDict[tuple[str, int, int], int] = OrderedDict()

    def of(self, priority_class: str, record: Record) -> int:
        try:
            sealed = self.seal.read(record.topic, record.partition, record.key, record.value, record.headers)
            if sealed.priority_class == priority_class:
                return sealed.arrival_ms
        except Unsealed:
            pass  # a producer's record, or one whose signature does not hold: its own claim of a time is not taken
        if getattr(record, "timestamp_type", None) == LOG_APPEND_TIME:
            return record.timestamp
        where = (record.topic, record.partition, record.offset)
        first = self.first_read.get(where)
        if first is None:
            first = self.first_read[where] = int(self.clock() * 1000)
            if len(self.first_read) > REMEMBERED:
                self.first_read.popitem(last=False)
        return first
