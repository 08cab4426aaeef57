"""The publisher's partition choice, without a broker: the partition of every message is Kafka's
default partitioner's, and each key is hashed once per `send_all` (a rejection's DLQ record and
its `rejected` event share a key)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord

from daemon.publisher import Outgoing, Publisher
from daemon.settings import Settings
from schemas import FieldError, Rejected, Rejection

# Unequal partition counts, so a key's partition can differ between the two topics.
EVENT_PARTITIONS, DLQ_PARTITIONS = 7, 5


class CountingPartitioner:
    """Kafka's default partitioner, counting the keys it is asked about."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        self.keys.append(key)
        return DefaultPartitioner()(key, all_partitions, available)


class Producer:
    """Stand-in for the producer: the topics' partitions, and which keys went to which partition."""

    def __init__(self, partitions: dict[str, int]) -> None:
        self.partitions = partitions
        self.sent: dict[tuple[str, int], list[bytes | None]] = {}

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions[topic]))

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, partition: int) -> asyncio.Future[None]:
        self.sent.setdefault((topic, partition), []).extend(batch.keys)
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Batch:
    def __init__(self) -> None:
        self.keys: list[bytes | None] = []

    def append(self, *, key: bytes | None, value: bytes, timestamp: None, headers: list[tuple[str, bytes]]) -> object:
        self.keys.append(key)
        return object()


async def publisher_on(producer_of: Callable[[Settings], Producer]) -> tuple[Settings, Publisher, Producer]:
    """A publisher whose producer is the stand-in and whose partitioner counts; its own producer,
    never started, is stopped so that it does not warn of being left open."""
    settings = Settings(gpus=[], warm_child=False)
    publisher = Publisher(settings)
    await publisher.stop()
    producer = producer_of(settings)
    publisher.producer, publisher.partitioner = producer, CountingPartitioner()  # type: ignore[assignment]
    return settings, publisher, producer


def rejection_messages(publisher: Publisher, settings: Settings, request_id: str, offset: int) -> list[Outgoing]:
    """What intake sends for one rejected record: its DLQ record and its `rejected` event, same key."""
    record = ConsumerRecord(settings.requests_topic, 0, offset, 0, 0, request_id.encode(), b"{", None, 1, 0, [])
    errors = [FieldError(path="", message="not UTF-8 JSON")]
    rejection = Rejection("not_json", errors, request_id)
    rejected = Rejected(request_id=request_id, host=settings.host, reason="not_json", errors=errors)
    return [publisher.dead_letter(record, rejection), publisher.event(rejected)]


async def test_each_key_is_hashed_once_and_lands_where_the_default_partitioner_puts_it() -> None:
    settings, publisher, producer = await publisher_on(lambda s: Producer({s.events_topic: EVENT_PARTITIONS, s.dlq_topic: DLQ_PARTITIONS}))
    ids = [f"bad-{i}" for i in range(20)]
    messages = [m for offset, request_id in enumerate(ids) for m in rejection_messages(publisher, settings, request_id, offset)]
    messages += rejection_messages(publisher, settings, ids[0], len(ids))  # the same key again, later in the batch

    await publisher.send_all(messages)

    # Once per key and partition count: the two topics' counts differ, so twice per key here.
    assert sorted(publisher.partitioner.keys) == sorted([i.encode() for i in ids] * 2)  # type: ignore[attr-defined]
    default = DefaultPartitioner()
    for topic, count in ((settings.events_topic, EVENT_PARTITIONS), (settings.dlq_topic, DLQ_PARTITIONS)):
        expected: dict[tuple[str, int], list[bytes | None]] = {}
        for message in (m for m in messages if m.topic == topic):
            expected.setdefault((topic, default(message.key, list(range(count)), list(range(count)))), []).append(message.key)
        assert {where: keys for where, keys in producer.sent.items() if where[0] == topic} == expected


async def test_topics_with_the_same_partitions_share_the_choice() -> None:
    settings, publisher, producer = await publisher_on(lambda s: Producer({s.events_topic: 6, s.dlq_topic: 6}))
    messages = [m for offset in range(10) for m in rejection_messages(publisher, settings, f"bad-{offset}", offset)]

    await publisher.send_all(messages)

    assert publisher.partitioner.keys == [f"bad-{offset}".encode() for offset in range(10)]  # type: ignore[attr-defined]
    default = DefaultPartitioner()
    for (_topic, partition), keys in producer.sent.items():
        assert all(default(key, list(range(6)), list(range(6))) == partition for key in keys)
