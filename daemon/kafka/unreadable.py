"""Records the Kafka client cannot read, stepped past rather than crashing the daemon (issue 37).

aiokafka decodes a record header's name as UTF-8 while it unpacks a fetched batch; a producer on
another client (librdkafka takes any bytes for a name) can send one that is not, and `getmany`
then raises UnicodeDecodeError on every call. Worse, the records of the same fetch before it are
lost with the exception, and aiokafka moves its position past them on the next call. So on an
error that is not Kafka's own, the daemon:

1. seeks every partition back to where it knows it should read next (`Partitions.expected`: past
   the last record handed to intake, or where it last sought), so nothing is skipped;
2. reads one record at a time per partition until the one that raises is met: its offset is then
   known exactly (the partition's expected position), since nothing else was read;
3. rejects it by its offset: a DLQ record without value (the client could not read it) naming the
   source offset where its bytes still are, a `rejected` event, and a commit past it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from daemon.kafka.clients import Consumer
from daemon.kafka.partitions import Partitions
from daemon.kafka.records import Record
from daemon.ops import metrics
from schemas import FieldError, Rejection

log = structlog.get_logger()

CAREFUL_TURNS = 10_000  # the most one-record reads before ordinary polling resumes, met or not


@dataclass(frozen=True)
class UnreadableRecord:
    """What is known of a record the client could not read: where it is."""

    topic: str
    partition: int
    offset: int
    key: bytes | None = None
    value: bytes | None = None
    headers: Sequence[tuple[str, bytes | None]] = field(default_factory=tuple)
    timestamp: int = -1


def unreadable(exc: BaseException) -> bool:
    """Whether an error of `getmany` is a record the client cannot read (not the brokers' or the group's)."""
    return isinstance(exc, Exception) and not isinstance(exc, KafkaError)


def rejection_of(record: UnreadableRecord, exc: BaseException) -> Rejection:
    message = (f"the Kafka client could not read this record ({type(exc).__name__}: {str(exc)[:200]}; a header name must be UTF-8); "
               f"its bytes are at offset {record.offset} of {record.topic}/{record.partition}")
    return Rejection("invalid", [FieldError(path="", message=message)], None, type(exc).__name__)


class CarefulReader:
    """Polling that steps past unreadable records (see the module's docstring)."""

    def __init__(self, consumer: Consumer, partitions: Partitions) -> None:
        self.consumer = consumer
        self.partitions = partitions
        self.careful_turns = 0

    async def poll(self, timeout_ms: int, max_records: int) -> tuple[Mapping[TopicPartition, Sequence[Record]], list[tuple[UnreadableRecord, BaseException]]]:
        """The next records per partition, and the unreadable records met (to be rejected)."""
        if self.careful_turns:
            return await self._one_each(timeout_ms)
        try:
            batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as exc:
            if not unreadable(exc):
                raise
            log.warning("poll.unreadable_record", error=type(exc).__name__, detail=str(exc)[:200], reason="reading one record at a time to find it")
            self.partitions.rewind()
            self.careful_turns = CAREFUL_TURNS
            return {}, []
        for tp, records in batches.items():
            self.partitions.handed(tp, records)
        return batches, []

    async def _one_each(self, timeout_ms: int) -> tuple[dict[TopicPartition, Sequence[Record]], list[tuple[UnreadableRecord, BaseException]]]:
        self.careful_turns -= 1
        batches: dict[TopicPartition, Sequence[Record]] = {}
        met: list[tuple[UnreadableRecord, BaseException]] = []
        for tp in sorted(self.partitions.assigned(), key=lambda tp: (tp.topic, tp.partition)):
            try:
                got = await self.consumer.getmany(tp, timeout_ms=timeout_ms // 10, max_records=1)
            except Exception as exc:
                if not unreadable(exc):
                    raise
                # Nothing of tp was read since the seek to it, so the record that raised is where tp stands.
                offset = self.partitions.expected.get(tp) or await self.consumer.position(tp)
                record = UnreadableRecord(tp.topic, tp.partition, offset)
                log.error("poll.unreadable_record_found", partition=tp.partition, offset=offset, error=type(exc).__name__)
                metrics.INTAKE_ERRORS.labels(type(exc).__name__).inc()
                self.partitions.read_from(tp, offset + 1)
                met.append((record, exc))
                self.careful_turns = 0  # found: ordinary polling again (another one would be met the same way)
                continue
            for got_tp, records in got.items():
                self.partitions.handed(got_tp, records)
                batches[got_tp] = records
        return batches, met
