"""Warm starts: every job's child forked from one fork server (the default), or with
child_start = "spawn" started ahead per free slot; either way each job gets a process of its own."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.children.forkserver import ForkServer
from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from handlers.child.forkserver import THREADS_PROBE
from schemas import Retrying, Started, Succeeded
from testbed.client import submit, terminal_events
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, wait_until_gone
from tests.helpers import sft_request

pytestmark = pytest.mark.slow


def started_pid(events: list) -> int:
    return next(e.pid for e in events if isinstance(e, Started))


async def test_queued_jobs_are_forked_from_one_server_which_is_replaced_when_it_dies(
    published: HubServer,
    settings: Settings,
    tmp_path: Path,
) -> None:
    settings = settings.model_copy(update={"retry_backoff_s": 0})
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        # Submitted at once: on the one slot the second waits for the first, as a queue of jobs does.
        await submit(settings, sft_request("fork-1", dataset={"rows": CHAT_ROWS}))
        await submit(settings, sft_request("fork-2", dataset={"rows": CHAT_ROWS}))
        queued = await terminal_events(settings, {"fork-1", "fork-2"})

        # The server dies (the out-of-memory killer, say) while a job runs: the child it forked dies
        # with it, the job is tried again, and a fresh server is started.
        events = []
        async with EventStream(settings, from_end=True) as stream:
            await submit(settings, sft_request("fork-3", dataset={"rows": CHAT_ROWS}))
            async for event in stream.events("fork-3"):
                events.append(event)
                if isinstance(event, Started) and event.attempt == 1:
                    [server] = [
                        line["pid"] for line in daemon.log_lines() if line.get("event") == "forkserver.starting"
                    ]
                    os.kill(server, signal.SIGKILL)
        lines = daemon.log_lines()
        assert daemon.stop() == 0
    finally:
        daemon.stop()

    servers = [line["pid"] for line in lines if line.get("event") == "forkserver.starting"]
    forked = {line["pid"]: line["server_pid"] for line in lines if line.get("event") == "child.forked"}
    first, second = (started_pid(queued[rid]) for rid in ("fork-1", "fork-2"))
    # Both queued jobs were forked from the one server started with the daemon: the imports were done once.
    assert first != second and forked[first] == forked[second] == servers[0]
    assert not [line for line in lines if line.get("event") == "child.warming"]  # no interpreter started per job
    for rid in ("fork-1", "fork-2"):
        done = queued[rid][-1]
        assert isinstance(done, Succeeded), done
        assert 0 < done.durations_s["until_first_step"] < done.durations_s["total"]

    retrying, done = next(e for e in events if isinstance(e, Retrying)), events[-1]
    assert retrying.code == "child_crashed" and "killed by SIGKILL" in retrying.message
    assert isinstance(done, Succeeded) and done.attempt == 2, events
    assert len(servers) == 2  # the dead one, then its replacement
    assert [line["pid"] for line in lines if line.get("event") == "forkserver.died"] == servers[:1]  # said once
    for pid in [*servers, *forked]:  # nothing outlives the daemon's stop
        await wait_until_gone(pid)


async def test_spawned_children_are_started_ahead_and_never_reused(
    published: HubServer, settings: Settings, tmp_path: Path
) -> None:
    daemon = DaemonProcess(settings.model_copy(update={"child_start": "spawn"}), tmp_path / "daemon.log").start()
    try:
        await submit(settings, sft_request("warm-1", dataset={"rows": CHAT_ROWS}))
        first = (await terminal_events(settings, {"warm-1"}))["warm-1"]
        await submit(settings, sft_request("warm-2", dataset={"rows": CHAT_ROWS}))
        second = (await terminal_events(settings, {"warm-2"}))["warm-2"]
        lines = daemon.log_lines()
    finally:
        daemon.stop()

    warmed = [line["pid"] for line in lines if line.get("event") == "child.warming"]
    pids = [started_pid(events) for events in (first, second)]
    # The first job ran in the child warmed at start; the second in the one warmed after the first job.
    assert pids == warmed[:2] and pids[0] != pids[1]
    assert not [line for line in lines if line.get("event") == "forkserver.starting"]
    for events in (first, second):
        done = events[-1]
        assert isinstance(done, Succeeded), done
        assert 0 < done.durations_s["until_first_step"] < done.durations_s["total"]


async def test_the_fork_server_has_no_openmp_workers_and_its_children_get_a_fresh_thread_count(tmp_path: Path) -> None:
    # A fork keeps none of libgomp's worker threads; a child of a server that had some can hang at its
    # first CPU matmul. So the server must be one thread (it refuses to serve otherwise:
    # tests/daemon/children/test_forkserver_safety.py), and each child gets the count a fresh process picks.
    log_path = tmp_path / "children.log"
    server = await ForkServer.start(dict(os.environ), log_path)
    try:
        assert await server.server.ready_task
        assert len(os.listdir(f"/proc/{server.server.process.pid}/task")) == 1
        child = await server.fork({}, log_path)
        assert await child.ready_task
        await child.stop(grace_s=2.0)
        await child.output_task
    finally:
        await server.close()
    fresh = int(
        subprocess.run([sys.executable, "-c", THREADS_PROBE], capture_output=True, text=True, check=True).stdout
    )
    assert f"adapterd job child {child.process.pid}: {fresh} intra-op threads" in log_path.read_text()
