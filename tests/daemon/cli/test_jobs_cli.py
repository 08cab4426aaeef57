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


def json_of(settings: Settings, *args: str) -> tuple[int, Any, str]:
    """The command's exit code, its stdout parsed as JSON (None when empty) and its stderr."""
    result = runner.invoke(app, list(args), env=settings_environment(settings))
    return result.exit_code, json.loads(result.stdout) if result.stdout else None, result.stderr


def test_jobs_json_is_each_requests_fields_as_the_table_lists_them(settings: Settings) -> None:
    """Issue 63: `adapterd jobs --json`, one JSON array, the table's requests in its order, times in ISO 8601."""
    publish(settings, HISTORY)
    code, said, stderr = json_of(settings, "jobs", "--json")
    assert code == 0, stderr
    assert [each["request_id"] for each in said] == list(rows(cli(settings, "jobs")[1]))
    done = said[0]
    assert done == {
        "request_id": "done-1",
        "state": "succeeded",
        "method": "sft",
        "host": "gpu-a",
        "attempt": 1,
        "since": done["since"],
        "last": done["last"],
        "latest": "succeeded",
        "detail": "published main: my-org/done-1@main",
        "events": 5,
    }
    assert datetime.fromisoformat(done["since"]) == HISTORY[0].time
    assert datetime.fromisoformat(done["last"]) == HISTORY[4].time
    broken = said[1]
    assert (broken["state"], broken["attempt"], broken["host"]) == ("failed", 2, "gpu-b")
    # The filters are the table's.
    assert [each["request_id"] for each in json_of(settings, "jobs", "--json", "--state", "running")[1]] == ["busy-3"]
    assert [each["request_id"] for each in json_of(settings, "jobs", "--json", "--host", "gpu-a")[1]] == [
        "done-1",
        "busy-3",
    ]


def test_get_json_is_the_request_with_its_history(settings: Settings) -> None:
    publish(settings, HISTORY)
    code, said, stderr = json_of(settings, "get", "done-1", "--json")
    assert code == 0, stderr
    assert (said["request_id"], said["state"], said["method"], said["attempt"], said["events"]) == (
        "done-1",
        "succeeded",
        "sft",
        1,
        5,
    )
    assert said["detail"] == "published main: my-org/done-1@main" and said["waiting"] is None
    # Its events as `adapterd events` prints them, the latest progress only, as the text shows them.
    shown = [HISTORY[index] for index in (0, 1, 3, 4)]
    assert said["history"] == [json.loads(event.model_dump_json()) for event in shown]
    code, said, stderr = json_of(settings, "get", "never-sent", "--json")
    assert code == 1 and said is None and "no events for never-sent" in stderr


def test_a_100_character_request_id_leaves_every_column_of_jobs_in_its_place(settings: Settings) -> None:
    """Issue 63: the REQUEST column was 28 characters wide, and a longer id (the demo's second, 30) pushed the rest of
    its row right. Each column is now as wide as its widest cell: every value starts under its header."""
    long = "sweep-lr-grid-3-" + "x" * 84
    publish(
        settings,
        [
            event("accepted", long, "gpu-a", 3, method="sft"),
            event("started", long, "gpu-a", 2, method="sft"),
            event("accepted", "r-2", "gpu-b", 1, method="dpo"),
        ],
    )
    code, lines = cli(settings, "jobs")
    assert code == 0 and len(lines) == 3
    header = lines[0]
    assert [line.split()[:4] for line in lines[1:]] == [
        [long, "running", "sft", "gpu-a"],
        ["r-2", "queued", "dpo", "gpu-b"],
    ]
    for line in lines[1:]:
        for name, value in zip(("STATE", "METHOD", "HOST"), line.split()[1:4], strict=True):
            assert line[header.index(name) :].startswith(value + " "), (name, line)
        assert line[header.index("TRY") + len("TRY") - 1] == "1"  # right-aligned under its header
