"""Cancelling a running and a queued request through the control topic, `adapterd status` and
`adapterd events`, and a job's timeout."""

import asyncio
import json
import os
import sys
from pathlib import Path

import pytest

from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas import Accepted, Cancelled, Failed
from testbed.client import child_pid, past_step, submit, submit_and_follow, terminal_events, wait_for_commit
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, http_get, metric, settings_environment
from tests.helpers import sft_request

pytestmark = pytest.mark.slow


async def adapterd(settings: Settings, *args: str) -> tuple[int, str]:
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
    return process.returncode or 0, output.decode()


async def test_cancel_running_and_queued_requests_then_a_timeout(
    published: HubServer, settings: Settings, tmp_path: Path
) -> None:
    # A poll interval far shorter than the job: the job runs beside the loop, so no rebalance follows.
    settings = settings.model_copy(update={"max_poll_interval_ms": 5_000, "session_timeout_ms": 6_000})
    with DaemonProcess(settings, tmp_path / "daemon.log") as daemon:
        await cancel_running_and_queued_requests_then_a_timeout(settings)
    assert sum(1 for line in daemon.log_lines() if line.get("event") == "partitions.assigned") == 1


async def cancel_running_and_queued_requests_then_a_timeout(settings: Settings) -> None:
    endless = sft_request(
        "cancel-running",
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 1_000_000, "save_steps": 1_000_000, "per_device_train_batch_size": 2},
    )
    events_so_far = await submit_and_follow(settings, endless, until=past_step(1))
    pid = child_pid(events_so_far)
    # One slot, one partition: this one waits in Kafka behind the running job.
    await submit(settings, sft_request("cancel-queued", dataset={"rows": CHAT_ROWS}))

    # Both requests count as lag: the running one is not committed until it ends.
    assert settings.metrics_address is not None
    async with asyncio.timeout(30):
        while (
            metric(http_get(settings.metrics_address, "/metrics")[1].decode(), "adapterd_consumer_lag", partition="0")
            != 2.0
        ):
            await asyncio.sleep(0.5)  # the daemon measures lag every few seconds; nothing to wait on but the metric

    code, output = await adapterd(settings, "status", "--json")
    assert code == 0, output
    [running] = json.loads(output)["jobs"]
    assert running["request_id"] == "cancel-running" and running["stage"] == "train" and running["pid"] == pid
    started_at = next(e.time for e in events_so_far if isinstance(e, Accepted))

    # Each cancel says what the events know of its request and what will happen (issue 49): the queued
    # one waits behind the running one on its partition, unread, so no host has said a word of it yet.
    code, said = await adapterd(settings, "cancel", "cancel-queued", "--reason", "superseded")
    assert code == 0 and said.startswith(
        "cancel-queued: never seen (no host published an event of it); the cancel is sent"
    ), said
    code, said = await adapterd(settings, "cancel", "cancel-running", "--reason", "wrong data")
    assert code == 0 and said.startswith("cancel-running: running on ") and "that host stops the job" in said, said
    events = await terminal_events(settings, {"cancel-running", "cancel-queued"}, timeout_s=60)

    cancelled = events["cancel-running"][-1]
    assert isinstance(cancelled, Cancelled) and cancelled.reason == "wrong data"
    assert (
        cancelled.time - started_at
    ).total_seconds() > settings.max_poll_interval_ms / 1000  # longer than the poll interval
    assert sum(1 for e in events["cancel-running"] if isinstance(e, Accepted)) == 1  # and never redelivered
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the trainer's process is gone, and with it its GPU memory
    [skipped] = events["cancel-queued"]  # no accepted, no started: never trained
    assert isinstance(skipped, Cancelled) and skipped.reason == "superseded"

    await submit(
        settings,
        sft_request(
            "times-out",
            dataset={"rows": CHAT_ROWS},
            timeout_s=2,
            training={"max_steps": 1_000_000, "per_device_train_batch_size": 2},
        ),
    )
    timed_out = (await terminal_events(settings, {"times-out"}))["times-out"]
    assert isinstance(timed_out[0], Accepted)
    assert isinstance(timed_out[-1], Failed) and timed_out[-1].code == "timeout" and not timed_out[-1].retryable
    assert "2 s" in timed_out[-1].message
    await wait_for_commit(settings, 3)

    code, output = await adapterd(settings, "events", "--request-id", "cancel-running")
    assert code == 0, output
    printed = [json.loads(line)["type"] for line in output.splitlines()]
    assert printed[0] == "accepted" and printed[-1] == "cancelled"

    # A cancel of a request that has ended is answered with its state, and nothing is sent: the
    # control topic holds the two cancels above only.
    code, said = await adapterd(settings, "cancel", "cancel-running")
    assert code == 0 and said.startswith("cancel-running: already cancelled on ") and "nothing sent" in said, said
    async with TopicReader(settings, settings.control_topic) as reader:
        sent = [record.key or b"" async for record in reader.records(follow=False)]
    assert sorted(sent) == [b"cancel-queued", b"cancel-running"]
