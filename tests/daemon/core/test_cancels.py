"""`Cancels` (daemon/jobs/cancels.py) on the in-memory fakes: a request cancelled before it is reached
ends in one `cancelled` event with the cancel's reason and its trace context, and its offset is
committed. Through the scheduler (a running job stopped, a request skipped): test_scheduler_core.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.jobs.cancels import Cancels
from daemon.settings import Settings
from schemas import Cancel
from tests.core import CoreOnFakes
from tests.helpers import sft_request

TRACEPARENT = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None)


async def test_a_request_cancelled_before_it_is_reached_ends_cancelled_with_its_reason_and_trace(
    settings: Settings,
) -> None:
    core = CoreOnFakes(settings)
    cancels = Cancels(settings.host, core.publisher, core.partitions)
    assert cancels.remember(Cancel(request_id="r1", reason="not wanted")) == "not wanted"
    assert cancels.remember(Cancel(request_id="r2")) == "cancelled"  # no reason given
    assert "r1" in cancels and "r2" in cancels and "r3" not in cancels

    record = core.record(sft_request("r1"), 5, headers=[("traceparent", TRACEPARENT)])
    await cancels.skip(core.tp, record, core.request(record), attempt=2)
    [sent] = core.producer.on(settings.events_topic)
    event = json.loads(sent.value)
    assert (event["type"], event["reason"], event["attempt"]) == ("cancelled", "not wanted", 2)
    assert ("traceparent", TRACEPARENT) in sent.headers
    assert core.consumer.commits == [(core.tp, 6)]
