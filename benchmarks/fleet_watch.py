"""Watching the fleet benchmark's daemons (benchmarks/fleet.py): `ready`, until each starts its next job warm and
the group's partitions are shared out (they say so only in their logs); `Collector`, every event of the run as
the figures read it, and a way to await a condition on them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from benchmarks.fleet_timeline import Seen, seen
from benchmarks.harness import warm_event
from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import Event
from testbed.processes import DaemonProcess


async def ready(daemons: list[DaemonProcess], settings: Settings, partitions: int, timeout_s: float = 300) -> None:
    """Until every daemon's next job starts warm and the group's partitions are shared out, each to one daemon
    (as of each daemon's latest assignment). The daemon says both only in its log, so this polls it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        logs = [daemon.log_lines() for daemon in daemons]
        warm = all(any(line.get("event") == warm_event(settings) for line in lines) for lines in logs)
        latest = [
            next(
                (
                    line.get("partitions") or []
                    for line in reversed(lines)
                    if line.get("event") == "partitions.assigned"
                ),
                [],
            )
            for lines in logs
        ]
        shared = sorted(p for assigned in latest for p in assigned) == list(range(partitions)) and all(latest)
        if warm and shared:
            return
        for daemon in daemons:
            assert daemon.process is not None
            if daemon.process.poll() is not None:
                raise RuntimeError(
                    f"a daemon exited ({daemon.process.returncode}) before it was ready; see {daemon.log_path}"
                )
        await asyncio.sleep(0.2)
    raise TimeoutError(f"the daemons were not all ready after {timeout_s}s: logs {[str(d.log_path) for d in daemons]}")


class Collector:
    """Every event of the run, as the figures read them, and a way to await a condition on them."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.events: list[Seen] = []
        self.raw: list[Event] = []  # as read, for the ETA's replay (daemon/fleet/policy/replay.py)
        self.changed = asyncio.Condition()

    async def run(self) -> None:
        async with EventStream(self.settings) as stream:
            async for event in stream.events(until_terminal=False):
                reduced = seen(event)
                self.raw.append(event)
                if reduced is not None:
                    self.events.append(reduced)
                    async with self.changed:
                        self.changed.notify_all()

    async def until(self, condition: Callable[[list[Seen]], bool], timeout_s: float) -> bool:
        """Whether `condition` held within `timeout_s`."""
        try:
            async with asyncio.timeout(timeout_s), self.changed:
                await self.changed.wait_for(lambda: condition(self.events))
            return True
        except TimeoutError:
            return False
