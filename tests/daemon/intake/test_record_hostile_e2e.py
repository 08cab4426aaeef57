"""Issue 37 end to end: every part of a record is input. Sent to a running daemon on one partition:
records with null, binary and forged headers, a null and a binary key, each hostile request of
tests/hostile.py's `record_cases` (rejected naming its field), a pattern PEFT would backtrack on for
hours (matched by the child with RE2: failed at once, naming the field), and valid requests right
behind them that succeed. The daemon stays up throughout, and feeds systemd's watchdog as often as
systemd would require: no gap between two WATCHDOG=1 as long as the period the daemon was given."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from daemon.cli.demo.requests import VISION_CHAT_ROWS
from daemon.kafka.copies import COPY_HEADROOM_BYTES
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import Failed, Rejected, Succeeded
from testbed.client import read_records, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, NotifySocket
from tests.helpers import sft_request
from tests.hostile import NotUtf8, python_record_builder, record_cases

pytestmark = pytest.mark.slow

LIMIT = 131_072  # the daemon's max_message_bytes here: the oversize case stays far under the broker's own
WATCHDOG_S = 20  # systemd's WatchdogSec for this daemon: it feeds every 10 s, and a gap of 20 s would kill it

HOSTILE_HEADERS = [
    ("adapterd-attempt", None),
    ("adapterd-not-before", b"\xff\xfe"),
    ("adapterd-retry-signature", None),
    ("traceparent", None),
    ("tracestate", b"\x80"),
    *((f"h{i}", None) for i in range(200)),
]


async def test_no_part_of_a_record_stops_the_daemon_or_the_requests_behind_it(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
) -> None:
    settings = settings.model_copy(update={"max_message_bytes": LIMIT})
    cases = record_cases(sft_request("valid"), VISION_CHAT_ROWS, LIMIT - COPY_HEADROOM_BYTES)
    backtracks = sft_request("backtracks", peft={"r": 4, "lora_alpha": 8, "target_modules": "([a-z._0-9]+)+Z"})
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:

        async def send(value: bytes, key: bytes | None, headers: list[tuple[str, bytes | None]] | None = None) -> None:
            await producer.send_and_wait(settings.requests_topic, value, key=key, partition=0, headers=headers or [])

        for name, raw, headers, _ in cases:
            await send(raw, f"record-{name}".encode(), list(headers))
        await send(
            b"{not json", None, list(HOSTILE_HEADERS)
        )  # a null key and null headers on a record that is not JSON
        await send(b'{"request_id": "record-binary-key"}', b"\xff\xfe", list(HOSTILE_HEADERS))
        await send(json.dumps(backtracks).encode(), b"backtracks")
        # Last of the hostile ones: a header name aiokafka cannot decode, its batch built by the pure-Python builder.
        with python_record_builder():
            await send(
                json.dumps(sft_request("record-header-name")).encode(), b"record-header-name", [(NotUtf8("x"), b"v")]
            )
        await send(json.dumps(sft_request("null-headers")).encode(), None, list(HOSTILE_HEADERS))
        await send(json.dumps(sft_request("right-behind")).encode(), b"right-behind")
    finally:
        await producer.stop()

    notify = NotifySocket(tmp_path / "notify.sock")
    listening = asyncio.create_task(notify.listen())
    daemon = DaemonProcess(
        settings, tmp_path / "daemon.log", extra_env=notify.environment(watchdog_usec=WATCHDOG_S * 1_000_000)
    ).start()
    try:
        ids = {f"record-{name}" for name, *_ in cases} | {
            "record-binary-key",
            "backtracks",
            "null-headers",
            "right-behind",
        }
        events = await terminal_events(settings, ids, timeout_s=300)
        all_decided = time.monotonic()
        dead_letters = await read_records(settings, settings.dlq_topic, len(cases) + 3, timeout_s=60)
        assert daemon.process is not None and daemon.process.poll() is None, "the daemon exited"
    finally:
        daemon.stop()
        listening.cancel()
        notify.close()

    # Fed from its first turn of the loop to past the last decision, never later than systemd allows.
    fed = notify.watchdog_times()
    # The last gap runs to the last decision: on a fast machine all may be decided before a second feed is due.
    assert "READY=1" in notify.lines and fed and fed[0] <= all_decided, notify.lines
    marks = sorted([*fed, all_decided])
    gaps = [later - earlier for earlier, later in zip(marks, marks[1:], strict=False)]
    assert max(gaps) < WATCHDOG_S, gaps

    for name, _, _, path in cases:
        terminal = events[f"record-{name}"][-1]
        assert isinstance(terminal, Rejected), (name, terminal)
        assert path in [error.path for error in terminal.errors], (name, terminal.errors)
    assert "max_message_bytes" in events["record-oversize"][-1].errors[0].message
    assert isinstance(events["record-binary-key"][-1], Rejected)
    failed = events["backtracks"][-1]
    assert isinstance(failed, Failed) and failed.code == "config_invalid" and "peft.target_modules" in failed.message, (
        failed
    )
    for request_id in ("null-headers", "right-behind"):
        assert isinstance(events[request_id][-1], Succeeded), events[request_id]
    assert events["null-headers"][0].attempt == 1
    by_offset = {int(dict(record.headers)["adapterd-source-offset"]): record for record in dead_letters}
    oversize = by_offset[[name for name, *_ in cases].index("oversize")]
    assert oversize.value == b"" and dict(oversize.headers)["adapterd-value-omitted"]  # said, not lost
    unreadable = by_offset[len(cases) + 3]  # after the cases, the two bad keys and the backtracking pattern
    assert dict(unreadable.headers)["adapterd-exception"] == b"UnicodeDecodeError" and unreadable.value == b""
