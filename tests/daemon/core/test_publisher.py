"""The publisher's partition choice, on the in-memory producer (no broker): the partition of every message is Kafka's
default partitioner's, and each key is hashed once per `send_all` (a rejection's DLQ record and
its `rejected` event share a key)."""

from __future__ import annotations

from collections.abc import Callable

from aiokafka.partitioner import DefaultPartitioner

from daemon.kafka.publisher import Outgoing, Publisher
from daemon.settings import Settings
from schemas import FieldError, Rejected, Rejection
from tests.fakes import FakeProducer, FakeRecord

# Unequal partition counts, so a key's partition can differ between the two topics.
EVENT_PARTITIONS, DLQ_PARTITIONS = 7, 5


class CountingPartitioner:
    """Kafka's default partitioner, counting the keys it is asked about."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []

    def __call__(self, key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
        self.keys.append(key)
        return DefaultPartitioner()(key, all_partitions, available)


async def publisher_on(
    partitions: Callable[[Settings], dict[str, int]],
) -> tuple[Settings, Publisher, FakeProducer, CountingPartitioner]:
    """A publisher on the in-memory producer (tests/fakes.py), its partitioner counting."""
    settings = Settings(gpus=[], warm_child=False)
    producer, partitioner = FakeProducer(partitions(settings)), CountingPartitioner()
    return settings, Publisher(settings, producer, partitioner), producer, partitioner


def placed(producer: FakeProducer) -> dict[tuple[str, int], list[bytes | None]]:
    """Which keys went to which partition of which topic."""
    found: dict[tuple[str, int], list[bytes | None]] = {}
    for message in producer.sent:
        found.setdefault((message.topic, message.partition), []).append(message.key)
    return found


def rejection_messages(publisher: Publisher, settings: Settings, request_id: str, offset: int) -> list[Outgoing]:
    """What intake sends for one rejected record: its DLQ record and its `rejected` event, same key."""
    record = FakeRecord(settings.requests_topic, 0, offset, request_id.encode(), b"{")
    errors = [FieldError(path="", message="not UTF-8 JSON")]
    rejection = Rejection("not_json", errors, request_id)
    rejected = Rejected(request_id=request_id, host=settings.host, reason="not_json", errors=errors)
    return [publisher.rejection_letter(record, rejection), publisher.event_message(rejected)]


async def test_each_key_is_hashed_once_and_lands_where_the_default_partitioner_puts_it() -> None:
    settings, publisher, producer, partitioner = await publisher_on(
        lambda s: {s.events_topic: EVENT_PARTITIONS, s.dlq_topic: DLQ_PARTITIONS}
    )
    ids = [f"bad-{i}" for i in range(20)]
    messages = [
        m for offset, request_id in enumerate(ids) for m in rejection_messages(publisher, settings, request_id, offset)
    ]
    messages += rejection_messages(publisher, settings, ids[0], len(ids))  # the same key again, later in the batch

    await publisher.send_all(messages)

    # Once per key and partition count: the two topics' counts differ, so twice per key here.
    assert sorted(partitioner.keys) == sorted([i.encode() for i in ids] * 2)
    default = DefaultPartitioner()
    for topic, count in ((settings.events_topic, EVENT_PARTITIONS), (settings.dlq_topic, DLQ_PARTITIONS)):
        expected: dict[tuple[str, int], list[bytes | None]] = {}
        for message in (m for m in messages if m.topic == topic):
            expected.setdefault((topic, default(message.key, list(range(count)), list(range(count)))), []).append(
                message.key
            )
        assert {where: keys for where, keys in placed(producer).items() if where[0] == topic} == expected


async def test_topics_with_the_same_partitions_share_the_choice() -> None:
    settings, publisher, producer, partitioner = await publisher_on(lambda s: {s.events_topic: 6, s.dlq_topic: 6})
    messages = [m for offset in range(10) for m in rejection_messages(publisher, settings, f"bad-{offset}", offset)]

    await publisher.send_all(messages)

    assert partitioner.keys == [f"bad-{offset}".encode() for offset in range(10)]
    default = DefaultPartitioner()
    for (_topic, partition), keys in placed(producer).items():
        assert all(default(key, list(range(6)), list(range(6))) == partition for key in keys)
