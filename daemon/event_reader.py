"""Read lifecycle events back from `adapterd.events`: for the CLI, the demo and the tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

from aiokafka import AIOKafkaConsumer, TopicPartition

from daemon.kafka_options import kafka_options
from daemon.settings import Settings
from daemon.topics import partition_numbers
from schemas import TERMINAL_TYPES, Event, parse_event


class EventStream:
    """Events of every partition of the events topic, from its beginning or from its end as of `start()`.

    Starting from the end before a request is published guarantees that every event of that request
    is seen, and none of an earlier request that had the same id.
    """

    def __init__(self, settings: Settings, *, from_end: bool = False) -> None:
        self.settings = settings
        self.from_end = from_end
        self.consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=None, enable_auto_commit=False)
        self.ends: dict[TopicPartition, int] = {}

    async def __aenter__(self) -> EventStream:
        await self.consumer.start()
        topic = self.settings.events_topic
        numbers = await partition_numbers(self.settings, topic)
        partitions = [TopicPartition(topic, number) for number in sorted(numbers)]
        self.consumer.assign(partitions)
        self.ends = await self.consumer.end_offsets(partitions)
        for tp in partitions:
            self.consumer.seek(tp, self.ends[tp] if self.from_end else 0)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.consumer.stop()

    async def events(self, request_id: str | None = None, *, until_terminal: bool = True, follow: bool = True) -> AsyncIterator[Event]:
        """The events, optionally of one request. With `until_terminal`, stop after that request's
        terminal event; without `follow`, stop once caught up with the end as of `start()`."""
        key = request_id.encode() if request_id is not None else None
        behind = {tp for tp, end in self.ends.items() if end > 0 and not self.from_end}
        if not follow and not behind:
            return
        while True:
            batches = await self.consumer.getmany(timeout_ms=1000)
            for tp, records in batches.items():
                for record in records:
                    if record.offset + 1 >= self.ends.get(tp, 0):
                        behind.discard(tp)
                    if key is not None and record.key != key:
                        continue
                    event = parse_event(record.value or b"")
                    yield event
                    if until_terminal and request_id is not None and event.type in TERMINAL_TYPES:
                        return
            if not follow and not behind:
                return


async def follow_events(settings: Settings, request_id: str | None = None, *, until_terminal: bool = True) -> AsyncIterator[Event]:
    """Events from the start of the topic, optionally of one request; stops after its terminal event."""
    async with EventStream(settings) as stream:
        async for event in stream.events(request_id, until_terminal=until_terminal):
            yield event
