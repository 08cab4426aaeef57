"""The waiting requests and the sweep cancel against a real daemon in fleet mode: its one slot busy, the
requests behind it wait in their classes' topics; `adapterd jobs --state queued` and `get` find them,
and a sweep cancels them and the running job, which the daemon honours: the waiting ones end
`cancelled` without ever training."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import Cancelled, Progress, Queued, Started
from testbed.client import produce, terminal_events
from testbed.data import CHAT_ROWS
from testbed.fleet_keys import shared_fleet_keys
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, settings_environment
from tests.helpers import sft_request

pytestmark = pytest.mark.slow

CLASSES = [{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}]


async def adapterd(settings: Settings, *args: str) -> tuple[int, list[str]]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "daemon.cli.app",
        *args,
        env=settings_environment(settings),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode().splitlines()


def request(request_id: str, **more: Any) -> dict[str, Any]:
    return sft_request(
        request_id,
        dataset={"rows": CHAT_ROWS},
        metadata={"sweep": "e2e"},
        training={"max_steps": 1_000_000, "save_steps": 1_000_000, "per_device_train_batch_size": 2},
        **more,
    )


async def test_the_requests_behind_a_busy_host_are_listed_in_order_and_a_sweep_cancels_them_and_the_running_job(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
) -> None:
    fleet = settings.model_copy(
        update={
            **shared_fleet_keys(),
            "priority_classes": Settings(priority_classes=CLASSES, **shared_fleet_keys()).priority_classes,
            "default_priority_class": "default",
            "claims_topic": f"claims-{settings.group_id}",
            "max_poll_interval_ms": 5_000,
            "session_timeout_ms": 6_000,
        }
    )
    await ensure_topics(fleet, partitions=2)
    daemon = DaemonProcess(fleet, tmp_path / "daemon.log").start()
    try:
        async with EventStream(fleet) as stream:
            await produce(
                fleet,
                json.dumps(request("run-long", priority_class="batch", team="search")).encode(),
                b"run-long",
                topic=fleet.class_topics["batch"],
            )
            async for event in stream.events("run-long"):
                if isinstance(event, Progress):
                    break  # its one slot is busy for as long as the test needs
        for request_id, cls, team in (
            ("wait-1", "batch", "search"),
            ("wait-2", "batch", "search"),
            ("urgent-1", "urgent", "oncall"),
        ):
            await produce(
                fleet,
                json.dumps(request(request_id, priority_class=cls, team=team)).encode(),
                request_id.encode(),
                topic=fleet.class_topics[cls],
            )

        # Read by no host (its one slot is busy), each is told its place soon after it
        # arrives (daemon/fleet/announcer.py).
        queued: dict[str | None, Queued] = {}
        async with asyncio.timeout(60), EventStream(fleet) as stream:
            async for event in stream.events(until_terminal=False):
                if isinstance(event, Queued):
                    queued[event.request_id] = event
                if len(queued) == 3:
                    break
        assert {rid: (e.place, e.priority_class, e.team) for rid, e in queued.items()} == {
            "urgent-1": (1, "urgent", "oncall"),
            "wait-1": (2, "batch", "search"),
            "wait-2": (3, "batch", "search"),
        }

        code, lines = await adapterd(fleet, "jobs", "--state", "queued")
        assert code == 0, lines
        listed = {line.split()[0]: line.split() for line in lines[1:]}
        assert list(listed) == ["urgent-1", "wait-1", "wait-2"]  # the class first; run-long runs, not listed
        assert [row[1:4] for row in listed.values()] == [
            ["urgent", "oncall", "1"],
            ["batch", "search", "2"],
            ["batch", "search", "3"],
        ]
        # Not claimed (the host has no room): each still in its class's topic, unread or held there by the host.
        assert all(
            row[5] in ("unread", "queued") and row[7].startswith(fleet.requests_topic) for row in listed.values()
        )
        code, lines = await adapterd(fleet, "get", "wait-2")
        assert (
            code == 0
            and lines[-1].startswith("wait-2: waiting (")
            and ", class batch, team search, place 3 of 3" in lines[-1]
        )

        code, lines = await adapterd(fleet, "cancel", "--selector", "sweep=e2e", "--reason", "sweep withdrawn")
        assert code == 0 and lines[0] == "matched 4 request(s) with metadata sweep=e2e: 3 waiting, 1 running", lines
        events = await terminal_events(fleet, {"run-long", "wait-1", "wait-2", "urgent-1"})
    finally:
        daemon.stop()
    for request_id, history in events.items():
        assert isinstance(history[-1], Cancelled) and history[-1].reason == "sweep withdrawn", (request_id, history)
    assert [e for e in events["run-long"] if isinstance(e, Started)]  # the running job was stopped
    for request_id in ("wait-1", "wait-2", "urgent-1"):
        assert not [e for e in events[request_id] if isinstance(e, Started)], request_id  # skipped: never trained
