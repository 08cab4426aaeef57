"""Retries read before they are due (their signed due time, daemon/kafka/retry_state.py): they hold no
slot and block no request behind them. One with requests behind it goes to the end of its partition
again, byte for byte, and is committed; one with nothing behind it holds its partition at it until it
is due or a new request arrives behind it (`due`, which the scheduler's `wake` asks at each turn).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import structlog
from aiokafka import TopicPartition

from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record

log = structlog.get_logger()


@dataclass(frozen=True)
class WaitingRetry:
    offset: int
    due: float  # time.time() at which the retry may run
    # The partition's end when it began to wait: a request past it is a new one behind (a retry waits only with nothing
    # behind it, so offset + 1; a held request may wait with held ones behind it, daemon/jobs/holds.py).
    end: int = -1

    @property
    def behind_from(self) -> int:
        return self.end if self.end >= 0 else self.offset + 1


class WaitingRetries:
    """The partitions held at a retry not yet due, each with its record's offset and due time."""

    def __init__(self, publisher: Publisher, partitions: Partitions) -> None:
        self.publisher = publisher
        self.partitions = partitions
        self.waiting: dict[TopicPartition, WaitingRetry] = {}

    def __contains__(self, tp: TopicPartition) -> bool:
        return tp in self.waiting

    async def not_yet(self, tp: TopicPartition, record: Record, due: float) -> bool:
        """A retry read before `due`: True when it went behind the requests after it (committed), False
        when nothing stands behind it and its partition is held at it."""
        if self.partitions.highwater(tp) > record.offset + 1:
            # Requests stand behind it: it goes behind them, byte for byte, and they go first.
            await self.publisher.deliver(self.publisher.deferred_copy(record))
            await self.partitions.commit(tp, record.offset + 1)
            log.info(
                "retry.deferred",
                key=(record.key or b"").decode(errors="replace"),
                partition=tp.partition,
                due_in_s=round(due - time.time(), 1),
            )
            return True
        self.hold_at(tp, record.offset, due)
        return False

    def hold_at(self, tp: TopicPartition, offset: int, due: float, end: int = -1) -> None:
        """Hold `tp` at `offset` until `due`, or until a request arrives past `end` (default: just past it)."""
        self.partitions.hold(tp, offset)
        self.waiting[tp] = WaitingRetry(offset, due, end)

    def due(self, now: float, end_offsets: Mapping[TopicPartition, int] | None) -> list[TopicPartition]:
        """The partitions whose retry is due at `now`, or has requests behind it by `end_offsets` (when
        measured): no longer waiting, to be read again."""
        ready = [
            tp
            for tp, waiting in self.waiting.items()
            if now >= waiting.due or (end_offsets is not None and end_offsets.get(tp, 0) > waiting.behind_from)
        ]
        for tp in ready:
            del self.waiting[tp]
        return ready

    def forget(self, tp: TopicPartition) -> None:
        self.waiting.pop(tp, None)

    def forget_all(self) -> None:
        """After a rebalance: the partitions start again at their retries, which are read anew."""
        self.waiting.clear()
