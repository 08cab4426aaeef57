"""Read `adapterd.control`: every daemon reads every message (no consumer group), so a cancel reaches
whichever host holds the request, running or not yet started; so does a hold, release, pause or resume
(daemon/jobs/holds.py).

At start the reader catches up on the messages of the last `control_lookback_s` before the daemon
takes any request, so a request cancelled while no daemon was running is still skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog
from pydantic import ValidationError

from daemon.kafka.records import Record
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas.control import CONTROL_ADAPTER, Control

log = structlog.get_logger()


class ControlReader:
    def __init__(self, settings: Settings, on_control: Callable[[Control], Awaitable[None]]) -> None:
        self.settings = settings
        self.on_control = on_control
        self.reader = TopicReader(settings, settings.control_topic, client_id=f"adapterd-control-{settings.host}")
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read from the start of each partition, and return once caught up with its end as of now."""
        await self.reader.start()
        self._task = asyncio.create_task(self._read(), name="control-reader")
        caught_up = asyncio.create_task(self.reader.caught_up.wait())
        await asyncio.wait([caught_up, self._task], return_when=asyncio.FIRST_COMPLETED)
        if self._task.done():
            caught_up.cancel()
            self._task.result()  # the reader failed: say why
        log.info("control.caught_up", partitions=len(self.reader.ends))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.reader.stop()

    async def _read(self) -> None:
        oldest_ms = (time.time() - self.settings.control_lookback_s) * 1000
        async for record in self.reader.records():
            if record.timestamp >= oldest_ms:
                await self._handle(record)

    async def _handle(self, record: Record) -> None:
        try:
            message = CONTROL_ADAPTER.validate_json(record.value or b"")
        except ValidationError as exc:
            # Logged, not dead-lettered: every daemon reads every control message, so each would send a copy.
            errors = [f"{'.'.join(map(str, e['loc'])) or '(message)'}: {e['msg']}" for e in exc.errors()]
            log.warning("control.invalid", partition=record.partition, offset=record.offset, errors=errors)
            return
        log.info(f"control.{message.type}", request_id=message.request_id, reason=message.reason)
        await self.on_control(message)
