"""`adapterd usage` against a real broker: the events of a few requests published with their records' times as a
daemon's are, GPU-hours per team and class in a period read back as a table and as JSON, only the events from the
period's start less the look-back read, and a period or grouping that is not one refused by its option's name."""

from __future__ import annotations

import asyncio
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from aiokafka import AIOKafkaProducer
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.cli.listing import USAGE_FIELDS
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import Event, parse_event
from testbed.processes import settings_environment
from tests.helpers import event_document

runner = CliRunner()
START = (datetime.now(UTC) - timedelta(days=10)).replace(microsecond=0)  # the period: 10 days ago to 5 days ago
END = START + timedelta(days=5)


def event(kind: str, request_id: str, hours: float, **fields: Any) -> Event:
    """docs/events.md's example of `kind`, for this request, `hours` after the period's start, its own event_id."""
    document = event_document(
        kind,
        request_id=request_id,
        time=(START + timedelta(hours=hours)).isoformat(),
        event_id=secrets.token_hex(16),
        **fields,
    )
    return parse_event(json.dumps(document).encode())


def run(request_id: str, team: str, priority_class: str, slot: str, since: float, until: float | None) -> list[Event]:
    events = [
        event("accepted", request_id, since, team=team, priority_class=priority_class),
        event("started", request_id, since, slot=slot),
    ]
    return events + ([event("succeeded", request_id, until)] if until is not None else [])


HISTORY = [
    *run("inside", "search", "batch", "0,1", 1, 4),  # 6 GPU-hours
    *run("straddle", "search", "batch", "2", -3, 2),  # 2 inside
    *run("cpu", "ads", "urgent", "cpu", 5, 6),  # a job, no GPU-hours
    *run("running", "ads", "urgent", "0,1,2,3", 5 * 24 - 1, None),  # still running: 4 inside the period
    *run("ancient", "ads", "urgent", "0", -72, 10),  # 10 inside, with a look-back of more than 3 days
]


def publish(settings: Settings, events: list[Event]) -> None:
    """Each event keyed by its request, its record's time its own, in the order of their times (as daemons publish
    them: the producer stamps each record when it sends it)."""

    async def send() -> None:
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
        await producer.start()
        try:
            for each in sorted(events, key=lambda each: each.time):
                await producer.send_and_wait(
                    settings.events_topic,
                    each.model_dump_json().encode(),
                    key=(each.request_id or "").encode(),
                    timestamp_ms=int(each.time.timestamp() * 1000),
                )
        finally:
            await producer.stop()

    asyncio.run(send())


def cli(settings: Settings, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["usage", *args], env=settings_environment(settings))
    return result.exit_code, result.stdout


def test_usage_totals_gpu_hours_per_team_and_class_read_from_the_periods_start_less_the_look_back(
    settings: Settings,
) -> None:
    publish(settings, HISTORY)
    period = ["--from", START.isoformat(), "--to", END.isoformat()]

    code, output = cli(settings, *period, "--json")
    assert code == 0, output
    assert json.loads(output) == [
        {
            "team": "ads",
            "priority_class": "urgent",
            "gpu_hours": 14.0,
            "jobs": 3,
            "runs": 3,
            "from": START.isoformat(),
            "to": END.isoformat(),
        },
        {
            "team": "search",
            "priority_class": "batch",
            "gpu_hours": 8.0,
            "jobs": 2,
            "runs": 2,
            "from": START.isoformat(),
            "to": END.isoformat(),
        },
    ]
    # A look-back of two days does not reach the ancient run's start: its events then are not read, and it is not seen.
    code, output = cli(settings, *period, "--look-back", "2d", "--json", "--by", "team")
    assert code == 0, output
    assert [(row["team"], row["gpu_hours"], row["jobs"]) for row in json.loads(output)] == [
        ("ads", 4.0, 2),
        ("search", 8.0, 2),
    ]
    assert all("priority_class" not in row for row in json.loads(output))
    assert list(json.loads(output)[0]) == [name for name in USAGE_FIELDS if name != "priority_class"]

    code, output = cli(settings, *period)
    assert code == 0, output
    # Plain columns in a pipe, as every listing verb's (daemon/cli/listing.py): the header first, the period on stderr.
    lines = [line.split() for line in output.splitlines()]
    assert lines[0] == ["TEAM", "CLASS", "GPU-HOURS", "JOBS", "RUNS"]
    assert ["ads", "urgent", "14.00", "3", "3"] in lines and ["search", "batch", "8.00", "2", "2"] in lines

    code, output = cli(settings, "--since", "6d", "--by", "class", "--json")  # 6 days ago to now: the running one
    assert code == 0, output
    [row] = json.loads(output)
    assert (row["priority_class"], row["jobs"], row["runs"]) == ("urgent", 1, 1) and row["gpu_hours"] > 4 * 24


def test_a_period_or_grouping_that_is_not_one_is_refused_by_its_option(settings: Settings) -> None:
    for args, said in [
        (["--since", "a month"], "--since: not an age"),
        (["--from", "yesterday"], "--from: not an ISO-8601 time"),
        (["--since", "2d", "--from", "2026-11-01"], "--since counts back from now"),
        (["--to", "2026-11-01"], "--to needs --from"),
        (["--from", "2026-11-02", "--to", "2026-11-01"], "is not before --to"),
        (["--by", "host"], "--by: 'host' is not team, class, or team,class"),
        (["--look-back", "forever"], "--look-back: not an age"),
    ]:
        result = runner.invoke(app, ["usage", *args], env=settings_environment(settings))
        assert result.exit_code == 2 and said in result.stderr, (args, result.output)
