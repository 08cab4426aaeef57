"""A request whose child dies every time, and one whose training hangs.

A request whose child dies every time: tried `max_attempts` times, each retry sent to the end of
its partition, then `failed` and its bytes in the DLQ; it never loops forever.

A retry waiting out its backoff (no slot held, the requests behind it served, its signed headers
kept byte for byte) is the scheduler's alone: tests/daemon/core/test_scheduler_core.py drives it on the
fakes in milliseconds (`test_a_retry_read_before_it_is_due_...`, `test_a_retryable_failure_...`)."""

import json
import os
import signal
from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Event, Failed, Progress, Retrying, Started
from testbed.client import child_pid, read_records, submit_and_follow, wait_for_commit
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, wait_until_gone
from tests.helpers import sft_request

pytestmark = pytest.mark.slow


async def test_a_child_that_crashes_every_time_ends_in_failed_and_the_dlq(settings: Settings, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"max_attempts": 2, "retry_backoff_s": 0})
    request = sft_request("crash-loop", dataset={"rows": CHAT_ROWS})

    def kill_each_child(events: list[Event]) -> bool:
        if isinstance(events[-1], Started):
            os.kill(events[-1].pid, signal.SIGKILL)  # the out-of-memory killer, say
        return False  # to its terminal event

    with DaemonProcess(settings, tmp_path / "daemon.log"):
        events = await submit_and_follow(settings, request, until=kill_each_child)
        dead = await read_records(settings, settings.dlq_topic, 1)
        await wait_for_commit(settings, 2)  # the request and its retry

    assert [(e.type, e.attempt) for e in events if e.type in ("started", "retrying", "failed")] == [
        ("started", 1),
        ("retrying", 1),
        ("started", 2),
        ("failed", 2),
    ]
    retrying, failed = next(e for e in events if isinstance(e, Retrying)), events[-1]
    assert retrying.code == "child_crashed" and retrying.max_attempts == 2
    assert isinstance(failed, Failed) and failed.code == "child_crashed" and failed.retryable
    assert "killed by SIGKILL" in failed.message
    [letter] = dead
    headers = {k: v.decode() for k, v in letter.headers}
    assert headers["adapterd-reason"] == "attempts_exhausted" and headers["adapterd-attempts"] == "2"
    assert json.loads(letter.value) == request and letter.key == b"crash-loop"


async def test_a_job_that_stops_stepping_is_stopped_as_stalled(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"max_attempts": 1, "stall_timeout_s": 3.0})
    request = sft_request(
        "stalls", dataset={"rows": CHAT_ROWS}, training={"max_steps": 1_000_000, "per_device_train_batch_size": 2}
    )

    def hang_the_child(events: list[Event]) -> bool:
        if isinstance(events[-1], Progress):
            os.kill(child_pid(events), signal.SIGSTOP)  # hung, as on a collective that never returns
        return False  # to its terminal event

    with DaemonProcess(settings, tmp_path / "daemon.log"):
        events = await submit_and_follow(settings, request, until=hang_the_child)
    event = events[-1]
    assert isinstance(event, Failed), event
    assert event.code == "stalled" and event.stage == "train" and "stall_timeout_s" in event.message
    await wait_until_gone(child_pid(events), timeout_s=10)


async def test_a_network_error_downloading_the_base_model_is_retryable(settings: Settings, tmp_path: Path) -> None:
    """The one transient rule (handlers.protocol.is_transient) holds for the child's downloads as for the
    push: a Hub that does not answer at all is worth another try, not a failure for good."""
    from daemon.local_broker import free_port

    settings = settings.model_copy(
        update={"max_attempts": 1, "hub_endpoint": f"http://127.0.0.1:{free_port()}"}
    )  # nothing listens
    with DaemonProcess(settings, tmp_path / "daemon.log"):
        events = await submit_and_follow(settings, sft_request("hub-down", dataset={"rows": CHAT_ROWS}))
    failed = events[-1]
    assert isinstance(failed, Failed), failed
    assert (failed.code, failed.stage, failed.retryable) == ("model_unavailable", "load_model", True)
    assert failed.message.startswith("model.id: cannot download tiny/qwen2-chat")
