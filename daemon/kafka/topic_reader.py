"""Read every partition of one topic without a consumer group: the one reader behind the control
topic (every daemon reads every cancel), the events topic (the CLI, the demo) and the tests.

It starts either at the beginning of each partition or at its end as of `start()`, and knows when
it has caught up with the ends it saw at `start()`, so a reader can stop there or go on following.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import TracebackType

from aiokafka import AIOKafkaConsumer, TopicPartition

from daemon.kafka.options import kafka_options
from daemon.kafka.records import Record
from daemon.kafka.topics import partition_numbers
from daemon.settings import Settings


class TopicReader:
    """`async with TopicReader(settings, topic) as reader: async for record in reader.records(): ...`"""

    def __init__(self, settings: Settings, topic: str, *, from_end: bool = False, client_id: str | None = None) -> None:
        self.settings = settings
        self.topic = topic
        self.from_end = from_end
        self.consumer = AIOKafkaConsumer(
            **kafka_options(settings), group_id=None, enable_auto_commit=False,
            **({"client_id": client_id} if client_id else {}),
        )
        self.ends: dict[TopicPartition, int] = {}
        # Set once every record that existed at `start()` has been yielded (at once when reading from the end).
        self.caught_up = asyncio.Event()

    async def start(self) -> TopicReader:
        """Assign every partition of the topic and place the reader; a LookupError if the topic is missing."""
        numbers = await partition_numbers(self.settings, self.topic)
        await self.consumer.start()
        partitions = [TopicPartition(self.topic, number) for number in sorted(numbers)]
        self.consumer.assign(partitions)
        self.ends = await self.consumer.end_offsets(partitions)
        for tp in partitions:
            self.consumer.seek(tp, self.ends[tp] if self.from_end else 0)
        return self

    async def stop(self) -> None:
        await self.consumer.stop()

    async def __aenter__(self) -> TopicReader:
        return await self.start()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.stop()

    async def records(self, *, follow: bool = True) -> AsyncIterator[Record]:
        """The records in partition order. Without `follow`, stop once caught up with the ends as of `start()`."""
        behind = set() if self.from_end else {tp for tp, end in self.ends.items() if end > 0}
        while True:
            if not behind and not self.caught_up.is_set():
                self.caught_up.set()
            if not behind and not follow:
                return
            batches = await self.consumer.getmany(timeout_ms=1000)
            for tp, records in batches.items():
                for record in records:
                    yield record
                    if record.offset + 1 >= self.ends.get(tp, 0):
                        behind.discard(tp)
