"""The broker goes away mid-job and comes back: the job goes on, the daemon reconnects, and every
event arrives once the broker is back (repeats carry the same event_id); one commit, one success."""

import asyncio
from datetime import UTC, datetime
from pathlib import Path

import pytest

from daemon.kafka.admin.topics import ensure_topics
from daemon.local_broker import LocalKafka
from daemon.settings import Settings
from schemas import Accepted, Progress, Started, Succeeded
from testbed.client import committed_offset, past_step, submit_and_follow, terminal_events
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

pytestmark = pytest.mark.slow

OUTAGE_S = 10  # how long the broker stays away: the fault itself, not a wait for anything


async def test_broker_stopped_and_restarted_mid_job(
    own_broker: LocalKafka, settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    settings = settings.model_copy(update={"bootstrap_servers": own_broker.bootstrap_servers})
    await ensure_topics(settings)
    request = sft_request(
        "through-an-outage",
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 150, "learning_rate": 1e-3, "per_device_train_batch_size": 2},
    )
    with DaemonProcess(settings, tmp_path / "daemon.log") as daemon:
        await submit_and_follow(settings, request, until=past_step(1))
        await asyncio.to_thread(own_broker.stop)
        away_from = datetime.now(UTC)
        await asyncio.sleep(OUTAGE_S)
        back_at = datetime.now(UTC)
        await asyncio.to_thread(own_broker.start)
        events = (await terminal_events(settings, {"through-an-outage"}))["through-an-outage"]
        assert daemon.process is not None and daemon.process.poll() is None  # it rode the outage out

    assert isinstance(events[-1], Succeeded), events[-1]
    unique = {e.event_id: e for e in events}.values()  # a retried send may repeat an event, with its event_id
    assert sorted(e.step for e in unique if isinstance(e, Progress)) == list(range(1, 151))
    assert sum(1 for e in unique if isinstance(e, Accepted)) == 1
    assert len(published.commits("results/through-an-outage")) == 1
    assert await committed_offset(settings) == 1
    # The job spanned the outage: it started before, and its events (held until the broker took them)
    # ended after; none of them was lost.
    started = next(e for e in unique if isinstance(e, Started))
    assert started.time < away_from and events[-1].time > back_at
