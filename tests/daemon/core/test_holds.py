"""Holds and pauses without priority classes (daemon/jobs/holds.py) through the scheduler on the in-memory fakes
(tests/core.py): a held request waits as a retry not yet due does, a release wakes its partition at once, a cancel
outranks a hold, and a paused job stops at its checkpoint and goes to the end of its partition, attempt unchanged,
to wait held until a resume. Milliseconds; tests/daemon/e2e/test_pause.py pauses a real trainer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.job.lifecycle import State
from daemon.jobs.offered import Offered
from daemon.settings import Settings
from handlers.protocol import CheckpointSaved, ProgressReport, StageEntered, StoppedAtCheckpoint
from schemas import CONTROL_ADAPTER, Cancel, Hold, Pause, Release, Resume
from tests.core import CoreOnFakes
from tests.daemon.core.test_scheduler_core import SUCCEEDS
from tests.fakes import FakeChildren, Script
from tests.helpers import sft_request


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None, progress_interval_s=0)


async def offer(core: CoreOnFakes, request_id: str, offset: int) -> Offered:
    record = core.record(sft_request(request_id), offset)
    return await core.scheduler.offer(core.tp, record, core.request(record))


def test_a_control_message_is_told_apart_by_its_type_and_one_without_a_type_is_a_cancel() -> None:
    assert isinstance(CONTROL_ADAPTER.validate_json(b'{"request_id": "r1"}'), Cancel)  # as before there were others
    assert isinstance(CONTROL_ADAPTER.validate_json(b'{"type": "pause", "request_id": "r1"}'), Pause)
    for bad in (b'{"type": "nap", "request_id": "r1"}', b'{"type": ["hold"], "request_id": "r1"}'):
        with pytest.raises(ValueError, match="type: not one of 'cancel', 'hold'"):
            CONTROL_ADAPTER.validate_json(bad)


async def test_a_held_request_alone_holds_its_partition_until_its_release_wakes_it(settings: Settings) -> None:
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    await core.scheduler.control(Hold(request_id="r1", reason="data under review"))
    assert await offer(core, "r1", 7) is Offered.WAITING
    assert core.consumer.sought[core.tp] == 7 and core.tp in core.consumer.paused and core.scheduler.holds(core.tp)
    assert children.taken == [] and core.consumer.commits == [] and core.requeued() == []
    assert [(e["type"], e["reason"]) for e in core.events("r1")] == [("held", "data under review")]

    core.scheduler.wake({core.tp: 8})  # nothing new behind it: it goes on waiting, however long
    assert core.tp in core.consumer.paused
    assert await offer(core, "r1", 7) is Offered.WAITING  # read again (a wake): told once a hold, not twice
    assert core.types("r1") == ["held"]

    await core.scheduler.control(Release(request_id="r1", reason="reviewed"))  # at once: no turn, no poll
    assert core.tp not in core.consumer.paused and not core.scheduler.holds(core.tp)
    assert [(e["type"], e["reason"]) for e in core.events("r1")][-1] == ("released", "reviewed")
    assert await offer(core, "r1", 7) is Offered.STARTED
    await core.scheduler.jobs[core.tp].task
    assert core.types("r1")[-1] == "succeeded" and core.consumer.commits == [(core.tp, 8)]


async def test_held_requests_go_behind_the_others_and_a_partition_of_held_ones_waits_rather_than_copying_them_on(
    settings: Settings,
) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    for request_id in ("h1", "h2"):
        await core.scheduler.control(Hold(request_id=request_id))
    core.consumer.ends[core.tp] = 9  # h1 at 7, h2 at 8
    assert await offer(core, "h1", 7) is Offered.DEFERRED
    [again] = core.requeued()
    assert again.key == b"h1" and core.consumer.commits == [(core.tp, 8)]
    core.consumer.ends[core.tp] = 10  # h1's copy at 9
    assert await offer(core, "h2", 8) is Offered.DEFERRED
    core.consumer.ends[core.tp] = 11  # h2's copy at 10
    # h1 again, with only held requests behind it: once round is enough; its partition waits at it.
    assert await offer(core, "h1", 9) is Offered.WAITING
    assert len(core.requeued()) == 2 and core.tp in core.consumer.paused and core.consumer.sought[core.tp] == 9
    core.scheduler.wake({core.tp: 11})  # h2's copy behind it is no new request
    assert core.tp in core.consumer.paused
    core.scheduler.wake({core.tp: 12})  # a new one: read again, and it goes behind h1 and h2 to reach it
    assert core.tp not in core.consumer.paused
    assert await offer(core, "h1", 9) is Offered.DEFERRED

    # h2 released while its partition waits at h1: the partition is read again (h1 goes behind, h2 starts).
    core2 = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    for request_id in ("h1", "h2"):
        await core2.scheduler.control(Hold(request_id=request_id))
    core2.consumer.ends[core2.tp] = 9
    assert await offer(core2, "h1", 7) is Offered.DEFERRED
    core2.consumer.ends[core2.tp] = 10
    assert await offer(core2, "h2", 8) is Offered.DEFERRED
    core2.consumer.ends[core2.tp] = 11
    assert await offer(core2, "h1", 9) is Offered.WAITING
    await core2.scheduler.control(Resume(request_id="h2"))
    assert core2.tp not in core2.consumer.paused
    core2.consumer.ends[core2.tp] = 11
    assert await offer(core2, "h1", 9) is Offered.DEFERRED  # another round, to reach h2
    assert await offer(core2, "h2", 10) is Offered.STARTED
    await core2.scheduler.jobs[core2.tp].task


async def test_a_cancel_outranks_a_hold_and_wakes_the_partition_waiting_at_it(settings: Settings) -> None:
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    await core.scheduler.control(Hold(request_id="r1"))
    assert await offer(core, "r1", 7) is Offered.WAITING
    await core.scheduler.control(Cancel(request_id="r1", reason="not wanted"))
    assert core.tp not in core.consumer.paused  # read again now, to end it
    assert await offer(core, "r1", 7) is Offered.SKIPPED
    assert core.types("r1") == ["held", "cancelled"] and children.taken == []
    assert core.consumer.commits == [(core.tp, 8)]


async def test_a_paused_job_stops_at_its_checkpoint_and_waits_held_at_its_partitions_end_without_spending_an_attempt(
    settings: Settings,
) -> None:
    hang = Script(
        messages=[
            StageEntered(stage="train"),
            ProgressReport(step=3, total_steps=10),
            CheckpointSaved(step=4, path="checkpoint-4"),
            StoppedAtCheckpoint(step=4, path="checkpoint-4"),
        ],
        hang=True,
    )
    children = FakeChildren(hang, SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    record = core.record(sft_request("r1"), 7, headers=[("x-producer", b"kept")])
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    job = core.scheduler.jobs[core.tp]
    await asyncio.wait_for(children.hanging.wait(), 5)

    await core.scheduler.control(Pause(request_id="r1", reason="free the GPU"))
    await job.task
    assert job.runner.lifecycle.history == [State.QUEUED, State.TRAINING, State.INTERRUPTED]
    assert children.taken[0].stopped_with == settings.drain_timeout_s  # the grace to save, as a daemon stop gives
    paused = core.events("r1")[-1]
    assert (paused["type"], paused["reason"], paused["stopped_at_step"], paused["resume_from_step"]) == (
        "paused",
        "free the GPU",
        4,
        4,
    )
    assert paused["attempt"] == 1 and "preemptions" not in paused
    # At the end of its partition byte for byte, headers and all (no attempt header added), then committed.
    [again] = core.requeued()
    assert again.value == record.value and again.headers == record.headers
    assert core.consumer.commits == [(core.tp, 8)] and core.scheduler.jobs == {} and core.slots.busy == 0

    # Read again while paused: it waits held (told once: `paused` said so), nothing trains.
    assert await offer(core, "r1", 9) is Offered.WAITING
    assert len(children.taken) == 1 and core.types("r1")[-1] == "paused"

    await core.scheduler.control(Resume(request_id="r1", reason="go on"))
    assert core.types("r1")[-1] == "released" and core.tp not in core.consumer.paused
    assert await offer(core, "r1", 9) is Offered.STARTED
    await core.scheduler.jobs[core.tp].task
    assert core.types("r1") == [
        *("accepted", "started", "progress", "checkpoint", "paused", "released"),
        *("accepted", "started", "progress", "succeeded"),
    ]
    assert core.events("r1")[-1]["attempt"] == 1 and core.consumer.commits[-1] == (core.tp, 10)


async def test_a_hold_leaves_a_running_job_running_and_a_pause_of_no_job_holds_it(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    assert await offer(core, "r1", 7) is Offered.STARTED
    job = core.scheduler.jobs[core.tp]
    await core.scheduler.control(Hold(request_id="r1"))
    await job.task
    assert core.types("r1")[-1] == "succeeded"
    await core.scheduler.control(Pause(request_id="r2", reason="later"))
    assert await offer(core, "r2", 8) is Offered.WAITING
    assert [(e["type"], e["reason"]) for e in core.events("r2")] == [("held", "later")]


async def test_a_pause_once_the_job_has_trained_is_too_late_and_it_ends_as_it_would(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its child gone and its slots free, the job is judged and pushed: an interrupt would stop a push half done and
    free nothing."""
    import threading

    from daemon.job import runner as job_module

    pushing, release = threading.Event(), threading.Event()
    real_push = job_module.hub_push.push

    def slow_push(*args: object, **kwargs: object) -> object:
        pushing.set()
        release.wait(30)
        return real_push(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(job_module.hub_push, "push", slow_push)
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    assert await offer(core, "r1", 7) is Offered.STARTED
    job = core.scheduler.jobs[core.tp]
    await asyncio.to_thread(pushing.wait, 30)
    await core.scheduler.control(Pause(request_id="r1", reason="too late"))
    release.set()
    await job.task
    assert core.types("r1")[-1] == "succeeded" and "paused" not in core.types("r1")
    assert core.consumer.commits == [(core.tp, 8)] and core.requeued() == []
