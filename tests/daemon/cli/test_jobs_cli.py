"""`adapterd jobs` and `adapterd get` against a real broker: the events of several requests from two
hosts, published to the events topic as daemons publish them, folded into each request's latest
state, filtered, and one request's history told event by event."""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaProducer
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import Event, parse_event
from testbed.processes import settings_environment
from tests.helpers import event_document

runner = CliRunner()
NOW = datetime.now(UTC)


def event(kind: str, request_id: str, host: str, minutes_ago: float, **fields: Any) -> Event:
    """docs/events.md's example of `kind`, for this request, from `host`, `minutes_ago`, with an event_id of its own
    (the examples share theirs, and a reader takes an id once)."""
    document = event_document(
        kind,
        request_id=request_id,
        host=host,
        time=(NOW - timedelta(minutes=minutes_ago)).isoformat(),
        event_id=secrets.token_hex(16),
        **fields,
    )
    return parse_event(json.dumps(document).encode())


HISTORY = [
    event("accepted", "done-1", "gpu-a", 300, method="sft"),
    event("started", "done-1", "gpu-a", 299, method="sft"),
    event("progress", "done-1", "gpu-a", 298, step=1, total_steps=4),
    event("progress", "done-1", "gpu-a", 297, step=4, total_steps=4),
    event(
        "succeeded", "done-1", "gpu-a", 296, method="sft", repo_id="my-org/done-1", revision="main", published="main"
    ),
    event("accepted", "broken-2", "gpu-b", 60, method="dpo"),
    event("retrying", "broken-2", "gpu-b", 59, code="hub_unavailable", stage="push"),
    event("accepted", "broken-2", "gpu-b", 58, method="dpo", attempt=2),
    event(
        "failed",
        "broken-2",
        "gpu-b",
        57,
        code="dataset_invalid",
        stage="preflight",
        message="dataset row 3: text is empty",
        attempt=2,
    ),
    event("accepted", "busy-3", "gpu-a", 2, method="grpo"),
    event("started", "busy-3", "gpu-a", 1, method="grpo"),
    event("progress", "busy-3", "gpu-a", 0.5, step=7, total_steps=50),
    event("rejected", "bad-4", "gpu-b", 1),
]


def publish(settings: Settings, events: list[Event]) -> None:
    async def send() -> None:
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
        await producer.start()
        try:
            for each in events:
                await producer.send_and_wait(
                    settings.events_topic, each.model_dump_json().encode(), key=(each.request_id or "").encode()
                )
        finally:
            await producer.stop()

    asyncio.run(send())


def cli(settings: Settings, *args: str) -> tuple[int, list[str]]:
    result = runner.invoke(app, list(args), env=settings_environment(settings))
    return result.exit_code, result.output.splitlines()


def rows(lines: list[str]) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in lines[1:]}


def test_jobs_lists_each_requests_latest_state_and_filters(settings: Settings) -> None:
    publish(settings, HISTORY)
    code, lines = cli(settings, "jobs")
    assert code == 0 and lines[0].split()[:3] == ["REQUEST", "STATE", "METHOD"]
    listed = rows(lines)
    assert list(listed) == ["done-1", "broken-2", "bad-4", "busy-3"]  # oldest latest event first
    assert listed["done-1"][1:5] == [
        "succeeded",
        "sft",
        "gpu-a",
        "1",
    ] and "published main: my-org/done-1@main" in " ".join(listed["done-1"])
    assert listed["broken-2"][1:5] == ["failed", "dpo", "gpu-b", "2"] and "dataset_invalid in preflight" in " ".join(
        listed["broken-2"]
    )
    assert listed["busy-3"][1:3] == ["running", "grpo"] and "train step 7/50" in " ".join(listed["busy-3"])
    assert listed["bad-4"][1] == "rejected"

    assert list(rows(cli(settings, "jobs", "--state", "running", "--state", "failed")[1])) == ["broken-2", "busy-3"]
    assert list(rows(cli(settings, "jobs", "--method", "sft")[1])) == ["done-1"]
    assert list(rows(cli(settings, "jobs", "--host", "gpu-a")[1])) == ["done-1", "busy-3"]
    assert list(rows(cli(settings, "jobs", "--since", "2h")[1])) == ["broken-2", "bad-4", "busy-3"]
    code, lines = cli(settings, "jobs", "--state", "finished")
    assert code == 2


def test_get_tells_one_requests_history_and_where_it_stands(settings: Settings) -> None:
    publish(settings, HISTORY)
    code, lines = cli(settings, "get", "done-1")
    assert code == 0
    assert [line.split()[2] for line in lines[:-1] if not line.startswith(" ")] == [
        "accepted",
        "started",
        "progress",
        "succeeded",
    ]
    assert "(step 4/4)" in lines[2]  # the latest progress only
    assert lines[-1] == "done-1: succeeded, method sft, attempt 1, on gpu-a; published main: my-org/done-1@main"
    code, lines = cli(settings, "get", "broken-2")
    assert code == 0 and lines[-1].startswith(
        "broken-2: failed, method dpo, attempt 2, on gpu-b; dataset_invalid in preflight"
    )
    code, _ = cli(settings, "get", "never-sent")
    assert code == 1
