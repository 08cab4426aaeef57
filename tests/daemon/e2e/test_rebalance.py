"""A second daemon joins the group mid-job and later leaves: the job whose partition stays keeps
running untouched; the job whose partition moves is stopped by its old owner, never committed
there, and finished by the new one; one success and one Hub commit each."""

from pathlib import Path

import pytest

from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import Progress, Started, Succeeded
from testbed.client import submit, terminal_events, wait_for_commit
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, NotifySocket
from tests.helpers import ids_on_partitions, sft_request

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def test_a_daemon_joining_and_leaving_mid_job(settings: Settings, published: HubServer, tmp_path: Path) -> None:
    # Range assignment over members named by client id (adapterd-<host>-...): host-a keeps partition 0.
    base = settings.model_copy(
        update={"requests_topic": settings.requests_topic + "-2p", "partition_assignment": "range"}
    )
    await ensure_topics(base, partitions=2)
    first = base.model_copy(update={"host": "host-a", "job_slots": 2, "work_dir": tmp_path / "a"})
    second = base.model_copy(
        update={"host": "host-b", "warm_child": False, "work_dir": tmp_path / "b", "metrics_address": None}
    )
    stays, moves = ids_on_partitions("rebalance", 2)
    training = {"max_steps": 200, "learning_rate": 1e-3, "per_device_train_batch_size": 2}

    a = DaemonProcess(first, tmp_path / "a.log").start()
    notify = NotifySocket(tmp_path / "b.sock")
    b = DaemonProcess(second, tmp_path / "b.log", extra_env=notify.environment())
    try:
        async with EventStream(base) as stream:
            for request_id in (stays, moves):
                await submit(base, sft_request(request_id, dataset={"rows": CHAT_ROWS}, training=training))
            training_on_a: set[str | None] = set()
            async for event in stream.events(until_terminal=False):
                if isinstance(event, Progress) and event.host == "host-a":
                    training_on_a.add(event.request_id)
                if training_on_a == {stays, moves}:
                    break
        b.start()
        await notify.wait_for("READY=1", timeout_s=120)  # joined: the group has rebalanced
        events = await terminal_events(base, {stays, moves}, timeout_s=400)
        assert b.stop() == 0  # and leaves again
        await wait_for_commit(base, 1, partition=0)
        await wait_for_commit(base, 1, partition=1)
    finally:
        a.stop()
        b.stop()
        notify.close()

    kept, moved = events[stays], events[moves]
    assert [e.host for e in kept if isinstance(e, Started)] == ["host-a"]  # never interrupted
    assert isinstance(kept[-1], Succeeded) and kept[-1].host == "host-a"
    assert [e.host for e in moved if isinstance(e, Started)] == ["host-a", "host-b"]
    assert isinstance(moved[-1], Succeeded) and moved[-1].host == "host-b"
    a_log = a.log_lines()
    assert [line["request_id"] for line in a_log if line.get("event") == "job.partition_moved"] == [moves]
    assert not [
        line
        for line in a_log
        if line.get("event") == "event.published"
        and line.get("request_id") == moves
        and line.get("type") in ("succeeded", "failed")
    ]
    for request_id in (stays, moves):
        assert len(published.commits(f"results/{request_id}")) == 1
