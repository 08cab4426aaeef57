"""When a request of a class's queue arrived, as the fleet's order takes it (issue 61): never the
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

from daemon.kafka.queue_seal import QueueSeal, Unsealed
from daemon.kafka.records import Record

LOG_APPEND_TIME = 1  # a record's `timestamp_type` when the broker stamped it (aiokafka's ConsumerRecord)
REMEMBERED = 65_536  # records whose first read this host remembers, across its re-reads of a partition


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
