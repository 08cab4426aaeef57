"""The first waiting record of a queue partition this host holds (`Head`), as the fleet's rules see it:
a `Waiting` request of daemon/fleet/order.py, whose key is the head itself."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiokafka import TopicPartition

from daemon.fleet.order import Waiting, waiting_for
from daemon.fleet_config import team_of
from daemon.kafka.records import Record
from schemas import Rejection, RequestBase


@dataclass(eq=False)
class Head:
    record: Record
    tp: TopicPartition
    queue: str  # the class whose topic it was read from
    group: str  # that topic's consumer group
    request: RequestBase | None  # None: it does not decode (claimed as it is; intake rejects it)
    priority_class: str
    due: float | None = None  # a retry's due time
    moves_to: str | None = None  # the topic of the class it names, when not this one
    preemptions: int = 0
    # Rejected where it is: too large for the copies a move makes, a record the client cannot read
    # (daemon/kafka/unreadable.py), which no move could copy, or a team or class not granted to its writer
    # (daemon/admission/grants.py), never ordered as it.
    rejection: Rejection | None = None
    named_id: str | None = None  # the request id the record names, even when it does not decode
    generation: int = 0  # its queue's rebalances when it was read (ClassQueue.generation)
    seen_at: float = field(default_factory=time.time)

    @property
    def request_id(self) -> str:
        return self.request.request_id if self.request is not None else f"{self.tp.topic}/{self.tp.partition}@{self.record.offset}"

    @property
    def team(self) -> str:
        return team_of(self.request.team if self.request is not None else None)

    @property
    def arrived(self) -> float:
        return self.record.timestamp / 1000

    def not_yet_due(self, now: float) -> bool:
        return self.due is not None and self.due > now

    def waiting(self) -> Waiting:
        if self.request is not None:
            return waiting_for(self.request, self.priority_class, self.arrived, key=self)
        return Waiting(self.request_id, self.priority_class, self.team, self.arrived, "", "", 1, key=self)
