"""A consumer group's committed offsets, read with the admin client: from the outside, without joining
the group (joining would start a rebalance of the daemons that are its members)."""

from __future__ import annotations

from collections.abc import Iterable

from aiokafka.admin import AIOKafkaAdminClient

from daemon.kafka.options import kafka_options
from daemon.settings import Settings


async def committed_offsets(settings: Settings, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[int, int]]:
    """For each (group, topic): partition → the group's committed offset, the next record it will read.
    A partition the group never committed is left out (its members start at the first record)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    found: dict[tuple[str, str], dict[int, int]] = {}
    try:
        await admin.start()
        for group, topic in wanted:
            offsets = await admin.list_consumer_group_offsets(group)
            found[(group, topic)] = {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic and meta.offset >= 0}
    finally:
        await admin.close()
    return found
