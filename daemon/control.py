"""Read `adapterd.control`: every daemon reads every message (no consumer group), so a cancel reaches
whichever host holds the request, running or not yet started.

At start the reader catches up on the messages of the last `control_lookback_s` before the daemon
takes any request, so a request cancelled while no daemon was running is still skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.structs import ConsumerRecord
from pydantic import ValidationError

from daemon.kafka_options import kafka_options
from daemon.settings import Settings
from schemas.control import Cancel

log = structlog.get_logger()


class ControlReader:
    def __init__(self, settings: Settings, on_cancel: Callable[[Cancel], Awaitable[None]]) -> None:
        self.settings = settings
        self.on_cancel = on_cancel
        self.consumer = AIOKafkaConsumer(
            **kafka_options(settings), group_id=None, enable_auto_commit=False,
            client_id=f"adapterd-control-{settings.host}",
        )
        self.caught_up = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, partition_numbers: set[int]) -> None:
        """Read from the start of each partition, and return once caught up with its end as of now."""
        await self.consumer.start()
        partitions = [TopicPartition(self.settings.control_topic, number) for number in sorted(partition_numbers)]
        self.consumer.assign(partitions)
        await self.consumer.seek_to_beginning(*partitions)
        ends = await self.consumer.end_offsets(partitions)
        self._task = asyncio.create_task(self._read(ends), name="control-reader")
        await self.caught_up.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.consumer.stop()

    async def _read(self, ends: dict[TopicPartition, int]) -> None:
        oldest_ms = (time.time() - self.settings.control_lookback_s) * 1000
        behind = {tp for tp, end in ends.items() if end > 0}
        if not behind:
            self.caught_up.set()
        while True:
            batches = await self.consumer.getmany(timeout_ms=1000)
            for tp, records in batches.items():
                for record in records:
                    if record.timestamp >= oldest_ms:
                        await self._handle(record)
                    if record.offset + 1 >= ends.get(tp, 0):
                        behind.discard(tp)
            if not behind and not self.caught_up.is_set():
                log.info("control.caught_up", partitions=len(ends))
                self.caught_up.set()

    async def _handle(self, record: ConsumerRecord[bytes, bytes]) -> None:
        try:
            cancel = Cancel.model_validate_json(record.value or b"")
        except ValidationError as exc:
            # Logged, not dead-lettered: every daemon reads every control message, so each would send a copy.
            errors = [f"{'.'.join(map(str, e['loc'])) or '(message)'}: {e['msg']}" for e in exc.errors()]
            log.warning("control.invalid", partition=record.partition, offset=record.offset, errors=errors)
            return
        log.info("control.cancel", request_id=cancel.request_id, reason=cancel.reason)
        await self.on_cancel(cancel)
