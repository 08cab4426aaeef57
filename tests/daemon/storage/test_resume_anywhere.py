"""A job's progress survives its host: two daemons, each with a work folder of its own and one checkpoint
store (moto's S3 server). The first is stopped (SIGTERM, within its deadline) or lost (SIGKILL, never
restarted) mid-training; the second runs the request from the store's newest whole checkpoint, and the
first step it trains is the one after it. One Hub commit; the store holds nothing of it afterwards."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

from daemon.settings import Settings
from daemon.store.checkpoints import CheckpointStore
from daemon.store.opening import store_of as opened_store
from schemas import Checkpoint, Progress, Started, Succeeded
from schemas.events import EventBase
from testbed.client import child_pid, past_step, submit_and_follow
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, run_to_terminal, wait_until_gone
from tests.conftest import S3_CREDENTIALS
from tests.helpers import fleet_key, sft_request

pytestmark = pytest.mark.slow

BUCKET = "fleet-checkpoints"


def with_store(settings: Settings, s3_endpoint: str, tmp_path: Path) -> tuple[Settings, Settings]:
    """Host A's settings and host B's: the same topics, group and store; their own disks and names."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    if BUCKET not in [bucket["Name"] for bucket in client.list_buckets()["Buckets"]]:
        client.create_bucket(Bucket=BUCKET)
    shared = settings.model_copy(
        update={
            "checkpoint_store": f"s3://{BUCKET}/{uuid.uuid4().hex[:8]}",
            "event_signing_key_file": fleet_key(
                tmp_path
            ),  # the fleet's key: it signs what the hosts write to the store
            "dataset_storage_options": {"s3": {"client_kwargs": {"endpoint_url": s3_endpoint}}},
            "session_timeout_ms": 10_000,  # a SIGKILLed member leaves the group when its session times out
        }
    )
    return (
        shared.model_copy(update={"host": "host-a", "work_dir": tmp_path / "host-a"}),
        shared.model_copy(update={"host": "host-b", "work_dir": tmp_path / "host-b"}),
    )


def store_of(settings: Settings) -> CheckpointStore:
    store = opened_store(settings)
    assert store is not None
    return store


async def run_on_b(host_b: Settings, tmp_path: Path, request_id: str) -> list[EventBase]:
    return await run_to_terminal(DaemonProcess(host_b, tmp_path / "host-b.log", extra_env=S3_CREDENTIALS), request_id)


def resumed_run(events: list[EventBase]) -> tuple[Started, list[int]]:
    """host-b's `started` and the steps it trained."""
    start = [i for i, event in enumerate(events) if isinstance(event, Started) and event.host == "host-b"][-1]
    started = events[start]
    assert isinstance(started, Started)
    return started, [event.step for event in events[start:] if isinstance(event, Progress)]


async def test_a_host_lost_for_good_its_job_resumes_on_another_from_the_store(
    settings: Settings,
    published: HubServer,
    s3_endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    host_a, host_b = with_store(settings, s3_endpoint, tmp_path)
    request_id = "lost-host-1"
    request = sft_request(
        request_id,
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 60, "save_steps": 5, "learning_rate": 1e-3, "per_device_train_batch_size": 2},
    )
    with DaemonProcess(host_a, tmp_path / "host-a.log", extra_env=S3_CREDENTIALS) as daemon:
        events = await submit_and_follow(
            host_a,
            request,
            until=lambda events: (
                isinstance(events[-1], Checkpoint) and events[-1].location == "store" and events[-1].step >= 10
            ),
        )
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL  # lost for good: never restarted
    stored = events[-1]
    assert isinstance(stored, Checkpoint), stored
    await wait_until_gone(child_pid(events))
    assert stored.store_url == f"{host_a.checkpoint_store}/{request_id}/checkpoint-{stored.step}"

    events = await run_on_b(host_b, tmp_path, request_id)
    assert isinstance(events[-1], Succeeded) and events[-1].host == "host-b", events[-1]
    started, steps = resumed_run(events)
    assert started.resumed_from == "store" and started.resumed_step is not None and started.resumed_step >= stored.step
    assert started.resumed_step % 5 == 0
    assert steps[0] == started.resumed_step + 1 and steps[-1] == 60  # not one checkpointed step trained again
    assert not (host_b.jobs_dir / request_id / "checkpoints" / "checkpoint-0").exists()
    assert len(published.commits(f"results/{request_id}")) == 1
    assert store_of(host_b).complete(request_id) == []  # a succeeded job's checkpoints leave the store


async def test_sigterm_saves_and_uploads_within_the_deadline_and_another_host_resumes(
    settings: Settings,
    published: HubServer,
    s3_endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in S3_CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    host_a, host_b = with_store(settings, s3_endpoint, tmp_path)
    host_a = host_a.model_copy(update={"drain_timeout_s": 30.0})
    request_id = "deadline-stop-1"
    request = sft_request(
        request_id,
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 100, "save_steps": 10_000, "learning_rate": 1e-3, "per_device_train_batch_size": 2},
    )
    with DaemonProcess(host_a, tmp_path / "host-a.log", extra_env=S3_CREDENTIALS) as daemon:
        await submit_and_follow(host_a, request, until=past_step(3))
        assert daemon.stop(signal.SIGTERM, timeout_s=host_a.drain_timeout_s + 30) == 0
    lines = daemon.log_lines()
    [stopped] = [line for line in lines if line.get("event") == "job.stopped_at_checkpoint"]
    [uploaded] = [line for line in lines if line.get("event") == "checkpoint_store.uploaded"]
    assert uploaded["step"] == stopped["step"] >= 3
    assert [manifest.step for manifest in store_of(host_a).complete(request_id)] == [stopped["step"]]

    events = await run_on_b(host_b, tmp_path, request_id)
    said = [event for event in events if isinstance(event, Checkpoint) and event.host == "host-a"]
    assert [(event.step, event.location) for event in said] == [(stopped["step"], "store")]
    assert isinstance(events[-1], Succeeded), events[-1]
    started, steps = resumed_run(events)
    assert (started.resumed_step, started.resumed_from) == (stopped["step"], "store")
    assert steps[0] == stopped["step"] + 1 and steps[-1] == 100
    assert len(published.commits(f"results/{request_id}")) == 1
