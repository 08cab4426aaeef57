"""Records that keep failing outside their job (the broker refused an event, a bug in the daemon):
each is read again, but not for ever. The same record failing `max_record_faults` times in a row
ends as `failed` (code `internal`), its bytes in the DLQ and its offset committed, so one record
cannot hold its partition for good."""

from __future__ import annotations

import structlog
from aiokafka import TopicPartition

from daemon.job.runner import JobRunner
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.ops import metrics
from daemon.settings import Settings
from schemas import Failed

log = structlog.get_logger()


class RecordFaults:
    """Unexpected failures in a row, per record, and what the scheduler does after each."""

    def __init__(self, settings: Settings, publisher: Publisher, partitions: Partitions) -> None:
        self.settings = settings
        self.publisher = publisher
        self.partitions = partitions
        self.counts: dict[tuple[TopicPartition, int], int] = {}

    def clear(self, tp: TopicPartition, offset: int) -> None:
        """The record's job ended as a job does: its count starts again."""
        self.counts.pop((tp, offset), None)

    async def failed(self, tp: TopicPartition, record: Record, runner: JobRunner, exc: Exception) -> None:
        """One more fault: the record is read again (its partition held at it), or given up on."""
        if tp not in self.partitions.assigned():
            return  # the partition moved: its new owner reads the record
        faults = self.counts[(tp, record.offset)] = self.counts.get((tp, record.offset), 0) + 1
        if faults < self.settings.max_record_faults or not await self._give_up(tp, record, runner, exc):
            self.partitions.hold(tp, record.offset)

    async def _give_up(self, tp: TopicPartition, record: Record, runner: JobRunner, exc: Exception) -> bool:
        """End the record: `failed` (code internal), its bytes in the DLQ, its offset committed.
        False when even that cannot be sent (it is read again)."""
        message = (
            f"handling the request failed {self.settings.max_record_faults} times in a row "
            f"({type(exc).__name__}); see the daemon's log"
        )
        return await self.end(tp, record, runner, exc, message)

    async def end(self, tp: TopicPartition, record: Record, runner: JobRunner, exc: Exception, message: str) -> bool:
        """End the record now, with `message`: as `_give_up`, without reading it again first (the
        broker refused its retry copy outright: reading it again would train it again)."""
        # No metadata: it may be what the broker refused.
        failed = runner.events.event(
            Failed, metadata=False, code="internal", stage="intake", retryable=False, message=message
        )
        try:
            await self.publisher.deliver(
                self.publisher.failed_letter(record, failed, reason="internal", exception=type(exc).__name__)
            )
            await runner.events.announce(failed)
            await self.partitions.commit(tp, record.offset + 1)
        except Exception:
            log.exception("job.give_up_failed", request_id=runner.request.request_id, offset=record.offset)
            return False
        self.clear(tp, record.offset)
        metrics.JOBS.labels("failed").inc()
        log.error(
            "job.given_up",
            request_id=runner.request.request_id,
            offset=record.offset,
            faults=self.settings.max_record_faults,
            error=type(exc).__name__,
        )
        return True
