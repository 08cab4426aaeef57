"""Publish lifecycle events and dead letters, each awaited until the broker acknowledges it.

One idempotent producer with acks=all: a `publish` that returns means the event is durable.
"""

from __future__ import annotations

import asyncio
import json

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord, RecordMetadata

from daemon.settings import Settings
from schemas import Rejection
from schemas.events import EventBase

log = structlog.get_logger()


class Publisher:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer = AIOKafkaProducer(
            bootstrap_servers=settings.bootstrap_servers,
            client_id=f"adapterd-{settings.host}",
            acks="all",
            enable_idempotence=True,
            linger_ms=5,
        )

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    async def publish(self, event: EventBase) -> None:
        """Publish one event and wait until the broker has it."""
        await (await self.send(event))
        log.info("event.published", type=getattr(event, "type"), request_id=event.request_id)

    async def send(self, event: EventBase) -> asyncio.Future[RecordMetadata]:
        """Queue one event; the returned future resolves once the broker has it. Many can be in flight."""
        event_type = getattr(event, "type")
        return await self.producer.send(
            self.settings.events_topic,
            event.model_dump_json().encode(),
            key=event.request_id.encode() if event.request_id else None,
            headers=[("adapterd-event-type", event_type.encode()), ("adapterd-schema-version", b"1")],
        )

    async def send_dead_letter(self, record: ConsumerRecord[bytes, bytes], rejection: Rejection) -> asyncio.Future[RecordMetadata]:
        """Queue the raw bytes of a message that could not become a job, with why and where it came from."""
        errors = json.dumps([error.model_dump() for error in rejection.errors])
        headers = [
            ("adapterd-reason", rejection.reason.encode()),
            ("adapterd-errors", errors.encode()),
            ("adapterd-source-topic", record.topic.encode()),
            ("adapterd-source-partition", str(record.partition).encode()),
            ("adapterd-source-offset", str(record.offset).encode()),
            ("adapterd-host", self.settings.host.encode()),
        ]
        return await self.producer.send(self.settings.dlq_topic, record.value, key=record.key, headers=headers)
