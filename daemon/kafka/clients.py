"""The Kafka clients the daemon talks to, as `Protocol`s: what `Publisher`, `Partitions` and
`Service` call on them, and nothing more. aiokafka's producer and consumer satisfy them (built by
`kafka_producer` and `kafka_consumer`); the test suite's in-memory fakes (tests/fakes.py) do too,
so the daemon's core runs in a unit test without a broker, as httpx runs on a test transport.

With priority classes the fleet's queue asks two more things of Kafka: a class topic's group consumer, which
also leaves its group (`QueueConsumer`, built by `queue_consumer`), and a transaction that writes copies and
commits a group's offset together (`Transactions`, aiokafka's transactional producer in `KafkaTransactions`).
Its reads of the queues from outside their groups (`QueueReads`) are daemon/kafka/admin/group_offsets.py's; the
three together are `FleetKafka`."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.structs import OffsetAndMetadata

from daemon.kafka.options import kafka_options
from daemon.kafka.records import Record
from daemon.settings import Settings

# The fleet's queue consumers (`queue_consumer`). A queue group rebalances whenever a host fills or frees a slot: its
# members learn of it at their next heartbeat, and a fetch of a queue partition answers at once when it has records,
# else after FETCH_WAIT_MS. Both short, so that a slot that frees takes its next request within a fraction of a second.
HEARTBEAT_MS = 250
FETCH_WAIT_MS = 100
# A queue consumer subscribed to a class topic that does not exist yet (made after this host started) learns of it
# only at its next metadata refresh: aiokafka's default of 5 minutes left requests waiting that long on an idle fleet.
# Every 2 s it is noticed within seconds, and partitions added by `adapterd topics --grow` too; the cost is one
# metadata request (the class's one topic) per class per host every 2 s, small beside the fetches every 100 ms.
QUEUE_METADATA_MAX_AGE_MS = 2_000

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


class QueueConsumer(Consumer, Protocol):
    """A class topic's consumer (daemon/fleet/queues.py): a member of its queue group only while its host wants
    the class's requests."""

    def unsubscribe(self) -> None: ...


@dataclass(frozen=True)
class Write:
    """One record a transaction writes: to `partition`, else by its key; at `timestamp_ms`, else the time it is sent."""

    topic: str
    partition: int | None
    key: bytes | None
    value: bytes
    timestamp_ms: int | None
    headers: list[tuple[str, bytes]]


class Transactions(Protocol):
    async def start(self) -> None: ...
    async def stop(self) -> None: ...
    async def commit_with(self, writes: Sequence[Write], group: str, tp: TopicPartition, offset: int) -> int | None:
        """Write `writes` and commit `group`'s offset of `tp` at `offset`, in one transaction: both or neither. The
        offset of the last write (None without one); raises when the broker refuses it (nothing written, nothing
        committed)."""


class QueueReads(Protocol):
    """The classes' queues read from the outside, without joining their groups (daemon/fleet/announcer.py);
    aiokafka's admin client and a reader in daemon/kafka/admin/group_offsets.py's `KafkaQueueReads`."""

    async def committed(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[int, int]]:
        """For each (group, topic): partition → the group's committed offset (a partition never committed: left out)."""

    async def waiting(self, topic: str, start_at: Mapping[int, int], most: int) -> Sequence[Record]:
        """The first `most` committed records of `topic` from `start_at` (partition → offset; left out: its first
        record) up to its end now, in partition order; TopicMissing when it does not exist."""

    async def close(self) -> None:
        """Close what the reads keep open between them (the dispatcher's stop)."""


@dataclass(frozen=True)
class FleetKafka:
    """What the fleet's queue asks of Kafka beside the daemon's consumer and producer (daemon/fleet/wiring.py builds
    aiokafka's; tests/fakes.py's `FakeFleetKafka` keeps them in memory)."""

    transactions: Transactions  # the host's moves: a claim, a preemption's requeue, a record committed past
    queue_consumer: Callable[[str], QueueConsumer]  # a class's queue group → the consumer of its topic
    reads: QueueReads  # the queues from outside their groups: the announcer's


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


def queue_consumer(settings: Settings, group: str) -> QueueConsumer:
    """A class topic's consumer in queue group `group`: it commits nothing itself (a move commits its offset in the
    move's transaction) and reads what moves committed only."""
    consumer: QueueConsumer = AIOKafkaConsumer(
        **kafka_options(settings),
        group_id=group,
        client_id=f"adapterd-{settings.host}-queue",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        heartbeat_interval_ms=HEARTBEAT_MS,
        fetch_max_wait_ms=FETCH_WAIT_MS,
        session_timeout_ms=settings.session_timeout_ms,
        metadata_max_age_ms=QUEUE_METADATA_MAX_AGE_MS,
    )
    return consumer


class KafkaTransactions:
    """`Transactions` over aiokafka's transactional producer, one transaction at a time. Its transactional id is the
    host's, so a daemon restarted on the host fences the old one's unfinished transaction (Kafka aborts it)."""

    def __init__(self, settings: Settings) -> None:
        self.producer = AIOKafkaProducer(
            **kafka_options(settings),
            client_id=f"adapterd-{settings.host}-moves",
            transactional_id=f"adapterd-moves-{settings.group_id}-{settings.host}",
            enable_idempotence=True,
            acks="all",
            max_request_size=settings.max_message_bytes,
        )

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def commit_with(self, writes: Sequence[Write], group: str, tp: TopicPartition, offset: int) -> int | None:
        async with self.producer.transaction():
            sent = [
                await self.producer.send(
                    write.topic,
                    value=write.value,
                    key=write.key,
                    partition=write.partition,
                    timestamp_ms=write.timestamp_ms,
                    headers=write.headers,
                )
                for write in writes
            ]
            await self.producer.send_offsets_to_transaction({tp: OffsetAndMetadata(offset, "")}, group)
        if not sent:
            return None
        metadata = await sent[-1]
        return int(metadata.offset)
