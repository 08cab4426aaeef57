"""The warm child: started before any request, it takes the next job; each job gets a fresh one."""

import pytest

from daemon.settings import Settings
from schemas import Started, Succeeded
from tests.helpers import (
    CHAT_ROWS,
    sft_request,
    submit,
    terminal_events,
)
from tests.hub_server import HubServer
from tests.processes import DaemonProcess

pytestmark = pytest.mark.slow


async def test_jobs_run_in_children_started_ahead_and_never_reused(daemon: DaemonProcess, published: HubServer, settings: Settings) -> None:
    await submit(settings, sft_request("warm-1", dataset={"rows": CHAT_ROWS}))
    first = (await terminal_events(settings, {"warm-1"}))["warm-1"]
    await submit(settings, sft_request("warm-2", dataset={"rows": CHAT_ROWS}))
    second = (await terminal_events(settings, {"warm-2"}))["warm-2"]

    warmed = [line["pid"] for line in daemon.log_lines() if line.get("event") == "child.warming"]
    pids = [next(e.pid for e in events if isinstance(e, Started)) for events in (first, second)]
    # The first job ran in the child warmed at start; the second in the one warmed after the first job.
    assert pids == warmed[:2] and pids[0] != pids[1]

    for events in (first, second):
        done = events[-1]
        assert isinstance(done, Succeeded), done
        assert 0 < done.durations_s["until_first_step"] < done.durations_s["total"]
