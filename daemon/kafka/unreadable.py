"""Records the Kafka client cannot read, stepped past rather than crashing the daemon (issues 37, 61).

aiokafka unpacks a fetched batch as it hands out its records, and some batches it cannot unpack: a
record header's name that is not UTF-8 (librdkafka takes any bytes for a name), a batch compressed
with a codec it has no library for or does not know (one Kafka adds later: `UnsupportedCodecError`),
or a batch whose checksum or framing is wrong (`CorruptRecordException`). `getmany` then raises on
every call. Worse, the records of the same fetch before it are lost with the exception, and aiokafka
moves its position past them on the next call. So on such an error (`unreadable`) every reader of a
topic, the daemon's and the CLI's alike, polls through `CarefulReader`, which:

1. seeks every partition back to where it knows it should read next (`Partitions.expected`: past
   the last record handed on, or where it last sought), so nothing is skipped;
2. reads one record at a time per partition until the one that raises is met: its offset is then
   known exactly (the partition's expected position), since nothing else was read;
3. steps past it by its offset and hands it to its reader, logged and counted: the daemon's intake
   rejects it (a DLQ record without value naming the source offset where its bytes still are, a
   `rejected` event, a commit past it; the fleet's queues do the same), the readers of the events and
   control topics go on without it. A compressed batch none can read is met record by record, each
   stepped past at its own offset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaError, UnsupportedCodecError

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


# Kafka's own errors that are a batch's doing, not the brokers' or the group's: aiokafka raises them only
# while it unpacks a fetched batch (its fetcher logs a broker's error code for a partition, it does not
# raise it). aiokafka offers no hook on a batch it cannot decode, so its public exception classes are
# what this relies on.
BATCH_ERRORS: tuple[type[KafkaError], ...] = (UnsupportedCodecError, CorruptRecordException)

# What a producer can do about each, said in the rejection.
HINTS: dict[type[BaseException], str] = {
    UnicodeDecodeError: "a header name must be UTF-8",
    UnsupportedCodecError: (
        "its batch is compressed with a codec this host cannot decompress: gzip, snappy, lz4 and zstd are read"
    ),
    CorruptRecordException: "its batch is corrupt",
}


def unreadable(exc: BaseException) -> bool:
    """Whether an error of `getmany` is a record the client cannot read (not the brokers' or the group's)."""
    return isinstance(exc, BATCH_ERRORS) or (isinstance(exc, Exception) and not isinstance(exc, KafkaError))


def rejection_of(record: UnreadableRecord, exc: BaseException) -> Rejection:
    hint = next((text for kind, text in HINTS.items() if isinstance(exc, kind)), None)
    message = (
        f"the Kafka client could not read this record ({type(exc).__name__}: "
        f"{str(exc)[:200]}{'; ' + hint if hint else ''}); its bytes are at offset {record.offset} of "
        f"{record.topic}/{record.partition}"
    )
    return Rejection("invalid", [FieldError(path="", message=message)], None, type(exc).__name__)


class CarefulReader:
    """Polling that steps past unreadable records (see the module's docstring)."""

    def __init__(self, consumer: Consumer, partitions: Partitions) -> None:
        self.consumer = consumer
        self.partitions = partitions
        self.careful_turns = 0

    async def poll(
        self, timeout_ms: int, max_records: int
    ) -> tuple[Mapping[TopicPartition, Sequence[Record]], list[tuple[UnreadableRecord, BaseException]]]:
        """The next records per partition, and the unreadable records met (to be rejected)."""
        if self.careful_turns:
            return await self._one_each(timeout_ms)
        try:
            batches = await self.consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except Exception as exc:
            if not unreadable(exc):
                raise
            log.warning(
                "poll.unreadable_record",
                topics=sorted({tp.topic for tp in self.partitions.assigned()}),
                error=type(exc).__name__,
                detail=str(exc)[:200],
                reason="reading one record at a time to find it",
            )
            self.partitions.rewind()
            self.careful_turns = CAREFUL_TURNS
            return {}, []
        for tp, records in batches.items():
            self.partitions.handed(tp, records)
        return batches, []

    async def _one_each(
        self, timeout_ms: int
    ) -> tuple[dict[TopicPartition, Sequence[Record]], list[tuple[UnreadableRecord, BaseException]]]:
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
                log.error(
                    "poll.unreadable_record_found",
                    topic=tp.topic,
                    partition=tp.partition,
                    offset=offset,
                    error=type(exc).__name__,
                    detail=str(exc)[:200],
                )
                metrics.UNREADABLE_RECORDS.labels(tp.topic, type(exc).__name__).inc()
                self.partitions.read_from(tp, offset + 1)
                met.append((record, exc))
                self.careful_turns = 0  # found: ordinary polling again (another one would be met the same way)
                continue
            for got_tp, records in got.items():
                self.partitions.handed(got_tp, records)
                batches[got_tp] = records
        return batches, met
