"""The Kafka clients the daemon talks to, as `Protocol`s: what `Publisher`, `Partitions` and
`Service` call on them, and nothing more. aiokafka's producer and consumer satisfy them (built by
`kafka_producer` and `kafka_consumer`); the test suite's in-memory fakes (tests/fakes.py) do too,
so the daemon's core runs in a unit test without a broker, as httpx runs on a test transport."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

from daemon.kafka.options import kafka_options
from daemon.kafka.records import Record
from daemon.settings import Settings

ASSIGNORS = {
    "range": RangePartitionAssignor,
    "roundrobin": RoundRobinPartitionAssignor,
    "sticky": StickyPartitionAssignor,
}


class Batch(Protocol):
    def append(
        self, *, key: bytes | None, value: bytes, timestamp: int | None, headers: list[tuple[str, bytes]]
    ) -> object | None:
        """Add a message; None when the batch is full (the caller sends it and starts another)."""


class Producer(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def partitions_for(self, topic: str) -> set[int]: ...
    def create_batch(self) -> Batch: ...
    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        """Queue a batch; the future is its acknowledgement by the broker."""


class Consumer(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None: ...
    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Record]]: ...
    def assignment(self) -> Collection[TopicPartition]: ...
    def highwater(self, tp: TopicPartition) -> int | None: ...
    def seek(self, tp: TopicPartition, offset: int) -> None: ...
    def pause(self, *partitions: TopicPartition) -> None: ...
    def resume(self, *partitions: TopicPartition) -> None: ...
    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None: ...
    async def end_offsets(self, partitions: list[TopicPartition]) -> Mapping[TopicPartition, int]: ...
    async def position(self, tp: TopicPartition) -> int: ...


def kafka_producer(settings: Settings) -> Producer:
    """The idempotent producer every event and dead letter goes through (acks=all)."""
    producer: Producer = AIOKafkaProducer(
        **kafka_options(settings),
        client_id=f"adapterd-{settings.host}",
        acks="all",
        enable_idempotence=True,
        linger_ms=20,  # fills batches under load (intake); events are not latency-critical at 20 ms
        max_batch_size=1 << 20,
        max_request_size=settings.max_message_bytes,  # the daemon's copies fit it (daemon/kafka/copies.py)
    )
    return producer


def kafka_consumer(settings: Settings) -> Consumer:
    """The requests topic's consumer: commits by hand, after a request's terminal event."""
    consumer: Consumer = AIOKafkaConsumer(
        **kafka_options(settings),
        group_id=settings.group_id,
        client_id=f"adapterd-{settings.host}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        # With priority classes the requests it runs are moved into the claims topic in transactions
        # (daemon/fleet/moves.py): an aborted move is never read. Without, the same as read_uncommitted.
        isolation_level="read_committed",
        max_poll_interval_ms=settings.max_poll_interval_ms,
        session_timeout_ms=settings.session_timeout_ms,
        group_instance_id=settings.group_instance_id,
        partition_assignment_strategy=(ASSIGNORS[settings.partition_assignment],),
    )
    return consumer
