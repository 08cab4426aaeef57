"""`WaitingRetries` (daemon/jobs/waiting_retries.py) on the in-memory fakes: a retry not yet due with
nothing behind it holds its partition at it, and `due` lets it go when its time comes or a request
arrives behind it, never before. The scheduler's side (`Offered.WAITING`, `DEFERRED`, `wake`) is
driven in test_scheduler_core.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.jobs.waiting_retries import WaitingRetries
from daemon.settings import Settings
from tests.core import CoreOnFakes
from tests.helpers import sft_request

DUE = 1_000_000.0


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None)


async def test_a_retry_with_nothing_behind_it_waits_until_due_or_until_a_request_arrives_behind_it(
    settings: Settings,
) -> None:
    core = CoreOnFakes(settings)
    waiting = WaitingRetries(core.publisher, core.partitions)
    retry = core.record(sft_request("r1"), 7)

    assert not await waiting.not_yet(core.tp, retry, DUE)  # held, not sent behind anything
    assert (
        core.tp in waiting
        and core.consumer.sought[core.tp] == 7
        and core.requeued() == []
        and core.consumer.commits == []
    )

    assert (
        waiting.due(DUE - 1, None) == [] and waiting.due(DUE - 1, {core.tp: 8}) == []
    )  # the retry itself ends the partition
    assert core.tp in waiting
    assert waiting.due(DUE - 1, {core.tp: 9}) == [core.tp]  # a request behind it
    assert core.tp not in waiting and waiting.due(DUE, None) == []  # let go once

    assert not await waiting.not_yet(core.tp, retry, DUE)
    assert waiting.due(DUE, None) == [core.tp]  # its time has come


async def test_a_retry_with_requests_behind_it_goes_behind_them_and_does_not_wait(settings: Settings) -> None:
    core = CoreOnFakes(settings)
    waiting = WaitingRetries(core.publisher, core.partitions)
    retry = core.record(sft_request("r1"), 7)
    core.consumer.ends[core.tp] = 9

    assert await waiting.not_yet(core.tp, retry, DUE)
    [again] = core.requeued()
    assert again.value == retry.value and core.consumer.commits == [(core.tp, 8)]
    assert core.tp not in waiting and waiting.due(DUE, None) == []


async def test_forgotten_retries_are_read_anew_not_let_go(settings: Settings) -> None:
    core = CoreOnFakes(settings)
    waiting = WaitingRetries(core.publisher, core.partitions)
    await waiting.not_yet(core.tp, core.record(sft_request("r1"), 7), DUE)
    waiting.forget(core.tp)
    assert core.tp not in waiting and waiting.due(DUE, None) == []
    await waiting.not_yet(core.tp, core.record(sft_request("r1"), 7), DUE)
    waiting.forget_all()
    assert core.tp not in waiting and waiting.due(DUE, None) == []
