"""A request of several GPUs is not starved by a stream of one-GPU requests (issue 62, item 6), on the in-memory
fakes (tests/core.py): a two-slot host reserved for a two-slot request once it has waited `reserve_after_s`, and a
short job backfilling the drain only when its expected end is before the reservation is due
(daemon/jobs/reservation.py). The scheduler's clock is the test's: no sleep."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from daemon.jobs.offered import Offered
from daemon.jobs.reservation import backfills, due
from daemon.settings import Settings
from handlers.protocol import ProgressReport, StageEntered
from schemas import Cancel
from tests.core import CoreOnFakes, turns_until
from tests.fakes import FakeChildren, Script
from tests.helpers import sft_request

HANGS = Script(messages=[StageEntered(stage="train")], hang=True)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A host of two CPU slots standing in for two GPUs: a request of `resources.gpus: 2` takes both.
    return Settings(
        gpus=[],
        job_slots=2,
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        max_attempts=2,
        retry_backoff_s=30,
        progress_interval_s=0,
    )


class Clock:
    """The scheduler's clock, moved by the test (from the real time, which progress reports are stamped with)."""

    def __init__(self) -> None:
        self.start = self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def at(self, seconds: float) -> None:
        self.now = self.start + seconds


def core_on(settings: Settings, children: FakeChildren) -> tuple[CoreOnFakes, Clock]:
    clock = Clock()
    return CoreOnFakes(settings, children=children, clock=clock), clock


async def offer(core: CoreOnFakes, request_id: str, partition: int, offset: int = 7, **overrides: Any) -> Offered:
    tp = TopicPartition(core.tp.topic, partition)
    core.consumer.committed[tp] = 0
    record = core.record(sft_request(request_id, **overrides), offset)
    record = type(record)(tp.topic, partition, offset, record.key, record.value, [])
    return await core.scheduler.offer(tp, record, core.request(record))


async def end(core: CoreOnFakes, request_id: str) -> None:
    """A running job ends (cancelled: the quickest end on the fakes), its slots given back."""
    job = next(job for job in core.scheduler.jobs.values() if job.request_id == request_id)
    await core.scheduler.cancel(Cancel(request_id=request_id, reason="its end"))
    await job.task


def running(core: CoreOnFakes) -> set[str]:
    return {job.request_id for job in core.scheduler.jobs.values() if job.placement is not None}


async def test_a_two_slot_request_behind_a_stream_of_one_slot_requests_starts_once_the_bound_has_passed(
    settings: Settings,
) -> None:
    """Before the bound the slots that free go to the stream, as ever; after it the host drains: no request of the
    stream starts, and the two-slot request starts as soon as the jobs running then have ended. Without the
    reservation the stream's next request takes each freed slot and the two-slot request never starts."""
    core, clock = core_on(settings.model_copy(update={"reserve_after_s": 30.0}), FakeChildren(HANGS))
    assert await offer(core, "s1", 0) is Offered.STARTED
    assert await offer(core, "s2", 2) is Offered.STARTED
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.NO_SLOT
    clock.at(10)  # within the bound: a freed slot goes to the stream
    await end(core, "s1")
    assert await offer(core, "s3", 0, offset=8) is Offered.STARTED
    clock.at(31)  # past it: the host is reserved for the two-slot request
    await end(core, "s2")
    assert (
        await offer(core, "s4", 2, offset=8) is Offered.NO_SLOT
    )  # a free slot, but no known end: it would put the reservation off
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.NO_SLOT  # s3 still holds a slot
    assert running(core) == {"s3"} and core.slots.free == ["cpu1"]
    await end(core, "s3")
    assert await offer(core, "s5", 0, offset=9) is Offered.NO_SLOT  # the stream goes on, and still waits
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.STARTED
    assert running(core) == {"big"} and core.scheduler.reservations.heads == {}
    assert await offer(core, "s5", 0, offset=9) is Offered.NO_SLOT  # both slots are big's
    await core.scheduler.stop_jobs()


async def test_a_short_job_backfills_the_drain_only_when_it_is_expected_to_end_before_the_reservation_is_due(
    settings: Settings,
) -> None:
    """Reserved at once (`reserve_after_s` 0), the host's free slot takes a job whose time limit ends before the running
    job does (the reservation's due time), and neither a longer one nor one with no time limit of its own past the
    operator's week."""
    core, clock = core_on(settings.model_copy(update={"reserve_after_s": 0.0}), FakeChildren(HANGS))
    assert await offer(core, "s1", 0, timeout_s=100) is Offered.STARTED
    assert await offer(core, "s2", 2, timeout_s=1000) is Offered.STARTED  # ends by t=1000: the reservation's due time
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.NO_SLOT
    clock.at(10)
    await end(core, "s1")
    assert await offer(core, "long", 0, offset=8, timeout_s=2000) is Offered.NO_SLOT  # would end at t=2010
    assert await offer(core, "unbounded", 3) is Offered.NO_SLOT  # max_timeout_s, a week
    assert await offer(core, "short", 4, timeout_s=500) is Offered.STARTED  # ends by t=510, before t=1000
    assert running(core) == {"s2", "short"}
    clock.at(20)
    await end(core, "s2")
    assert (
        await offer(core, "s3", 2, offset=8, timeout_s=600) is Offered.NO_SLOT
    )  # ends at t=620: after short, the due time now
    assert await offer(core, "s4", 5, timeout_s=400) is Offered.STARTED  # ends at t=420, before short does
    await end(core, "short")
    await end(core, "s4")
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.STARTED
    await core.scheduler.stop_jobs()


async def test_a_running_jobs_progress_eta_brings_the_reservation_forward_and_so_refuses_a_backfill(
    settings: Settings,
) -> None:
    """The due time reads a running job's last progress ETA before its time limit: a job that says it ends in 50 s
    leaves no room for a job of 500 s, though its own limit (1000 s) would."""
    children = FakeChildren(
        HANGS,
        by_request={
            "s2": [
                Script(
                    messages=[StageEntered(stage="train"), ProgressReport(step=1, total_steps=10, eta_s=50.0)],
                    hang=True,
                )
            ]
        },
    )
    core, clock = core_on(settings.model_copy(update={"reserve_after_s": 0.0}), children)
    assert await offer(core, "s1", 0, timeout_s=100) is Offered.STARTED
    assert await offer(core, "s2", 2, timeout_s=1000) is Offered.STARTED
    await turns_until(
        lambda: core.scheduler.jobs[TopicPartition(core.tp.topic, 2)].runner.supervisor.progress_at is not None
    )
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.NO_SLOT
    clock.at(10)
    await end(core, "s1")
    assert await offer(core, "short", 3, timeout_s=500) is Offered.NO_SLOT
    assert await offer(core, "shorter", 4, timeout_s=30) is Offered.STARTED  # ends at t=40, before s2's t=50
    await core.scheduler.stop_jobs()


def test_a_reservation_of_unknown_due_time_or_a_job_of_unknown_end_never_backfills() -> None:
    free_at = {"0": 0.0, "1": 100.0}
    assert due(free_at, 2) == 100.0
    assert backfills(free_at, ["0"], 100.0, 2) and not backfills(free_at, ["0"], 101.0, 2)
    assert not backfills(free_at, ["0"], None, 2)  # no time limit: no known end
    assert not backfills(
        {"0": 0.0, "1": math.inf}, ["0"], 1.0, 2
    )  # a running job of unknown end: nothing to fit before
    assert backfills({"0": 0.0, "1": 0.0, "2": 0.0}, ["0"], None, 2)  # a slot the reservation does not need
    assert not backfills({"0": 0.0, "1": 50.0, "2": 100.0}, ["0"], None, 2)  # it needs "0" and "1" at t=50


async def test_a_cancelled_or_moved_head_holds_no_reservation(settings: Settings) -> None:
    """A two-slot head skipped for its cancel, or whose partition moved, leaves the host to the stream at once."""
    core, clock = core_on(settings.model_copy(update={"reserve_after_s": 0.0}), FakeChildren(HANGS))
    assert await offer(core, "s1", 0, timeout_s=100) is Offered.STARTED
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.NO_SLOT
    assert await offer(core, "s2", 2) is Offered.NO_SLOT  # a week's limit, past s1's end
    await core.scheduler.cancel(Cancel(request_id="big", reason="not needed"))
    assert await offer(core, "big", 1, resources={"gpus": 2}) is Offered.SKIPPED
    assert await offer(core, "s2", 2) is Offered.STARTED
    await end(core, "s2")
    assert await offer(core, "big2", 3, resources={"gpus": 2}) is Offered.NO_SLOT
    await core.scheduler.on_assigned({TopicPartition(core.tp.topic, p) for p in (0, 2)})
    assert await offer(core, "s3", 2, offset=8) is Offered.STARTED
    await core.scheduler.stop_jobs()
