"""A consumer group's committed offsets, read with the admin client: from the outside, without joining
the group (joining would start a rebalance of the daemons that are its members).

The group's coordinator may not answer at once: on a cluster where no group has committed yet the
offsets topic is still being created, and after a broker restart it is being loaded; Kafka says so
with a retriable error, so the read is tried again for a few seconds before the error is the answer.

`KafkaQueueReads` is what the fleet's announcer reads of the classes' queues this way (`QueueReads`,
daemon/kafka/clients.py): each
group's committed offsets, and the records past them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from daemon.kafka.options import kafka_options
from daemon.kafka.records import Record
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings


async def committed_offsets(
    settings: Settings, wanted: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], dict[int, int]]:
    """For each (group, topic): partition → the group's committed offset, the next record it will read.
    A partition the group never committed is left out (its members start at the first record)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    found: dict[tuple[str, str], dict[int, int]] = {}
    try:
        await admin.start()
        for group, topic in wanted:
            offsets = await _offsets(admin, group)
            found[(group, topic)] = {
                tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0
            }
    finally:
        await admin.close()
    return found


async def _offsets(admin: AIOKafkaAdminClient, group: str, tries: int = 20) -> dict[TopicPartition, OffsetAndMetadata]:
    attempt = 1
    while True:
        try:
            return await admin.list_consumer_group_offsets(group)
        except KafkaError as exc:
            if not exc.retriable or attempt == tries:
                raise
        attempt += 1
        await asyncio.sleep(0.5)  # the coordinator is being made or loaded: Kafka offers nothing to await


class KafkaQueueReads:
    """`QueueReads` over aiokafka: a short-lived admin client and reader for each read."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    async def committed(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[int, int]]:
        return await committed_offsets(self.settings, wanted)

    async def waiting(self, topic: str, start_at: Mapping[int, int], most: int) -> list[Record]:
        found: list[Record] = []
        async with TopicReader(self.settings, topic, start_at=start_at, read_committed=True) as reader:
            async for record in reader.records(follow=False):
                if len(found) >= most:
                    break
                found.append(record)
        return found
