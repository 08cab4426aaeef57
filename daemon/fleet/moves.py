"""Moving a request from one topic to another in one Kafka transaction: the copy is written and the
offset it was read at is committed together, or neither is.

This is what makes the fleet's queue safe under SIGKILL and broker restarts: a request taken from a
class's queue into a host's claims partition (daemon/fleet/dispatcher.py), or sent back to its queue
when it is preempted (daemon/fleet/jobs.py), is never in both places, nor in neither. The
producer's transactional id is this host's, so a daemon restarted on the host fences the old one's
unfinished transaction (Kafka aborts it); the claims topic is read `read_committed`, so an aborted
copy is never run.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaProducer, TopicPartition
from aiokafka.structs import OffsetAndMetadata

from daemon.kafka.options import kafka_options
from daemon.kafka.records import Record
from daemon.settings import Settings

log = structlog.get_logger()


@dataclass(frozen=True)
class Move:
    """Copy `record` (its key, value and headers, less any null header and any named in `drop`) to
    `topic` (partition `partition`, or by its key), plus `headers`, and commit `group`'s offset of the
    record's own partition past it."""

    record: Record
    topic: str
    group: str
    partition: int | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    drop: frozenset[str] = frozenset()
    # Records before `record` in its partition, committed past with it: written again, as they were
    # (key, value, headers, timestamp), at the end of their own partition (daemon/fleet/queues.py).
    before: tuple[Record, ...] = ()


class Mover:
    """The host's transactional producer; one move at a time (a producer has one open transaction)."""

    def __init__(self, settings: Settings) -> None:
        self.producer = AIOKafkaProducer(
            **kafka_options(settings),
            client_id=f"adapterd-{settings.host}-moves",
            transactional_id=f"adapterd-moves-{settings.group_id}-{settings.host}",
            enable_idempotence=True,
            acks="all",
            max_request_size=settings.max_message_bytes,
        )
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def move(self, move: Move) -> int:
        """Do `move`; the offset of the copy. Raises (the transaction aborted, nothing moved) when the
        broker refuses it: the record stays where it was and is read again."""
        record = move.record
        headers = [(name, value) for name, value in record.headers or () if value is not None and name not in move.drop]
        async with self._lock:
            async with self.producer.transaction():
                for earlier in move.before:
                    await self.producer.send(
                        earlier.topic, value=earlier.value or b"", key=earlier.key, partition=earlier.partition, timestamp_ms=kept_timestamp(earlier.timestamp),
                        headers=[(name, value) for name, value in earlier.headers or () if value is not None],
                    )
                sent = await self.producer.send(
                    move.topic, value=record.value or b"", key=record.key, partition=move.partition, headers=[*headers, *move.headers],
                )
                await self.producer.send_offsets_to_transaction(
                    {TopicPartition(record.topic, record.partition): OffsetAndMetadata(record.offset + 1, "")}, move.group,
                )
            metadata = await sent
        log.debug("fleet.moved", from_topic=record.topic, partition=record.partition, offset=record.offset, to_topic=move.topic,
                  to_partition=metadata.partition, to_offset=metadata.offset)
        return int(metadata.offset)


def kept_timestamp(timestamp: int) -> int | None:
    """A record's own timestamp, written again as it was; a producer's impossible one (Kafka takes any 64-bit
    number) becomes the time of the move rather than a send the client refuses, which would stop the queue."""
    return timestamp if 0 <= timestamp < 2**53 else None
