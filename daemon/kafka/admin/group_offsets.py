"""A consumer group's committed offsets, read with the admin client: from the outside, without joining
the group (joining would start a rebalance of the daemons that are its members).

The group's coordinator may not answer at once: on a cluster where no group has committed yet the
offsets topic is still being created, and after a broker restart it is being loaded; Kafka says so
with a retriable error, so the read is tried again for a few seconds before the error is the answer.

`KafkaQueueReads` is what the fleet's announcer reads of the classes' queues this way (`QueueReads`,
daemon/kafka/clients.py): each group's committed offsets, and the records past them, every two seconds, through one
admin client and one reader a topic kept open between the reads (a client made for each read cost the announcer a
tenth of a core at rest: benchmarks.fleet_scale), each made again after an error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Mapping

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError
from aiokafka.structs import OffsetAndMetadata, TopicPartition

from daemon.errors import TopicMissing
from daemon.kafka.admin.topics import topic_partitions
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
    try:
        await admin.start()
        return await _committed(admin, wanted)
    finally:
        await admin.close()


async def _committed(
    admin: AIOKafkaAdminClient, wanted: Iterable[tuple[str, str]]
) -> dict[tuple[str, str], dict[int, int]]:
    found: dict[tuple[str, str], dict[int, int]] = {}
    for group, topic in wanted:
        offsets = await _offsets(admin, group)
        found[(group, topic)] = {
            tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0
        }
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
    """`QueueReads` over aiokafka: one admin client, and a reader for each topic, kept open between reads and made
    again after an error; `close` closes them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.admin: AIOKafkaAdminClient | None = None
        self.readers: dict[str, TopicReader] = {}

    async def committed(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[int, int]]:
        try:
            return await _committed(await self._admin(), wanted)
        except BaseException:
            await self._close_admin()
            raise

    async def waiting(self, topic: str, start_at: Mapping[int, int], most: int) -> list[Record]:
        # The topic's partitions asked each time: a topic deleted is TopicMissing (the announcer forgets what it read of
        # it), and one given partitions since gets a reader of them all.
        try:
            numbers = await topic_partitions(await self._admin(), self.settings, topic)
        except TopicMissing:
            await self._close_reader(topic)
            raise
        except BaseException:
            await self._close_admin()
            raise
        reader = self.readers.get(topic)
        try:
            if reader is not None and {tp.partition for tp in reader.ends} == numbers:
                await reader.again(start_at)
            else:
                await self._close_reader(topic)
                reader = TopicReader(self.settings, topic, start_at=start_at, read_committed=True)
                self.readers[topic] = await reader.start()
            found: list[Record] = []
            async for record in reader.records(follow=False):
                if len(found) >= most:
                    break
                found.append(record)
            reader.rest()
            return found
        except BaseException:
            await self._close_reader(topic)
            raise

    async def close(self) -> None:
        await self._close_admin()
        for topic in list(self.readers):
            await self._close_reader(topic)

    async def _admin(self) -> AIOKafkaAdminClient:
        if self.admin is None:
            admin = AIOKafkaAdminClient(**kafka_options(self.settings))
            try:
                await admin.start()
            except BaseException:
                await admin.close()
                raise
            self.admin = admin
        return self.admin

    async def _close_admin(self) -> None:
        admin, self.admin = self.admin, None
        if admin is not None:
            with contextlib.suppress(Exception):
                await admin.close()

    async def _close_reader(self, topic: str) -> None:
        reader = self.readers.pop(topic, None)
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader.stop()
