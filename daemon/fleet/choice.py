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
    arrived_ms: int | None = None  # when it arrived (daemon/fleet/arrival.py); None: when this host read it

    @property
    def request_id(self) -> str:
        return self.request.request_id if self.request is not None else f"{self.tp.topic}/{self.tp.partition}@{self.record.offset}"

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

    def waiting(self) -> Waiting:
        if self.request is not None:
            return waiting_for(self.request, self.priority_class, self.arrived, key=self)
        return Waiting(self.request_id, self.priority_class, self.team, self.arrived, "", "", 1, key=self)
