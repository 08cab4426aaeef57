"""Lifecycle events read back from `adapterd.events`, parsed: for the CLI, the demo and the tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType

from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas import TERMINAL_TYPES, Event, parse_event


class EventStream:
    """Events of every partition of the events topic, from its beginning or from its end as of entering.

    Entering from the end before a request is published guarantees that every event of that request
    is seen, and none of an earlier request that had the same id.
    """

    def __init__(self, settings: Settings, *, from_end: bool = False) -> None:
        self.reader = TopicReader(settings, settings.events_topic, from_end=from_end)

    async def __aenter__(self) -> EventStream:
        await self.reader.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.reader.stop()

    async def events(self, request_id: str | None = None, *, until_terminal: bool = True, follow: bool = True) -> AsyncIterator[Event]:
        """The events, optionally of one request. With `until_terminal`, stop after that request's
        terminal event; without `follow`, stop once caught up with the end as of entering."""
        key = request_id.encode() if request_id is not None else None
        async for record in self.reader.records(follow=follow):
            if key is not None and record.key != key:
                continue
            event = parse_event(record.value or b"")
            yield event
            if until_terminal and request_id is not None and event.type in TERMINAL_TYPES:
                return

