"""Read lifecycle events back from `adapterd.events`: for the CLI, the demo and the tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiokafka import AIOKafkaConsumer

from daemon.settings import Settings
from schemas import TERMINAL_TYPES, Event, parse_event


async def follow_events(settings: Settings, request_id: str | None = None, *, until_terminal: bool = True) -> AsyncIterator[Event]:
    """Events from the start of the topic, optionally of one request; stops after its terminal event."""
    consumer = AIOKafkaConsumer(
        settings.events_topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        async for record in consumer:
            if request_id is not None and record.key != request_id.encode():
                continue
            event = parse_event(record.value)
            yield event
            if until_terminal and request_id is not None and event.type in TERMINAL_TYPES:
                return
    finally:
        await consumer.stop()
