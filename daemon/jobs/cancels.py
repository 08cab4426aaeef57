"""Cancels from the control topic (daemon/kafka/control.py), remembered by request id: the scheduler
stops a running job (`Scheduler.cancel`), and a request cancelled before it is reached is skipped when
it is (`Cancels.skip`): its `cancelled` event, then its offset committed, no training. With priority
classes the dispatcher ends one it holds in a queue's window the same way, at its next turn
(daemon/fleet/dispatcher.py `_withdraw`, with `Cancels.ended`), rather than claiming it first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog
from aiokafka import TopicPartition

from daemon.job.events import JobEvents
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.ops import metrics
from schemas import Cancel, Cancelled, RequestBase

log = structlog.get_logger()


@dataclass
class Cancels:
    """Every cancel read since the daemon started: request id → reason."""

    host: str  # this host's name, in the events it publishes
    publisher: Publisher
    partitions: Partitions
    reasons: dict[str, str] = field(default_factory=dict)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.reasons

    def remember(self, cancel: Cancel) -> str:
        """The cancel's reason, kept for when its request is reached."""
        reason = self.reasons[cancel.request_id] = cancel.reason or "cancelled"
        return reason

    async def skip(self, tp: TopicPartition, record: Record, request: RequestBase, attempt: int) -> None:
        """A request cancelled before it started: its terminal event, then its offset; no training."""
        await self.ended(request, record, attempt)
        await self.partitions.commit(tp, record.offset + 1)

    async def ended(self, request: RequestBase, record: Record, attempt: int) -> None:
        """A cancelled request that never started: its `cancelled` event, with its cancel's reason. The caller commits
        past its record after this (an event published twice is better than a request ended with none)."""
        reason = self.reasons[request.request_id]
        log.info(
            "request.skipped_cancelled",
            request_id=request.request_id,
            reason=reason,
            topic=record.topic,
            offset=record.offset,
        )
        await JobEvents.for_record(self.publisher, request, self.host, attempt, record).publish(
            Cancelled, reason=reason
        )
        metrics.JOBS.labels("cancelled").inc()
