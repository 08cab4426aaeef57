"""Holds and pauses with priority classes on the in-memory fakes (daemon/jobs/holds.py through the dispatcher and the
claimed jobs): a held request in a class's queue is not claimed, holds up none behind it and is counted in no one's
place; a release wakes the dispatcher and it is claimed; a paused job's claim goes back to its class's queue as a
preempted one's does, without a count of preemptions or an attempt spent. Milliseconds each."""

from __future__ import annotations

from aiokafka import TopicPartition

from daemon.settings import Settings
from handlers.protocol import StageEntered
from schemas import Hold, Pause, Release, Resume
from tests.core import turns_until
from tests.daemon.core.test_fleet_core import CLAIMS, claims, host, settings, submit, turns
from tests.fakes import FakeChildren, Script

__all__ = ["settings"]  # the fixture, shared


async def test_a_held_request_is_passed_by_in_its_queue_and_claimed_once_released(settings: Settings) -> None:
    core, dispatcher = host(settings.model_copy(update={"job_slots": 3}), claims_partitions=3)
    submit(core, "held-1", "batch", at_ms=0)
    submit(core, "behind-1", "batch", at_ms=1)
    submit(core, "behind-2", "batch", at_ms=2)
    await core.scheduler.control(Hold(request_id="held-1", reason="data under review"))
    await turns(dispatcher)
    # A slot left free, and still not it: the two behind it are claimed; it is told it is held, and never `queued`.
    assert claims(core) == [b"behind-1", b"behind-2"] and dispatcher.room() == 1
    assert [(e["type"], e["reason"]) for e in core.events("held-1")] == [("held", "data under review")]

    dispatcher.wake.clear()
    await core.scheduler.control(Release(request_id="held-1", reason="reviewed"))
    assert dispatcher.wake.is_set()  # weighed at once, not at the next timed turn
    assert core.types("held-1") == ["held", "released"]
    await turns(dispatcher)
    assert claims(core) == [b"behind-1", b"behind-2", b"held-1"]


async def test_a_paused_claimed_job_goes_back_to_its_queue_without_a_preemption_and_waits_held(
    settings: Settings,
) -> None:
    children = FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True))
    core, dispatcher = host(settings, children)
    submit(core, "batch-1", "batch")
    await turns(dispatcher)
    [claim] = core.fleet.on(CLAIMS.topic)
    claims_tp = TopicPartition(CLAIMS.topic, claim.partition)
    await core.intake.take(claims_tp, [claim])  # the job starts
    await turns_until(lambda: children.hanging.is_set())

    await core.scheduler.control(Pause(request_id="batch-1", reason="free the GPU"))
    await turns_until(lambda: "paused" in core.types("batch-1"))
    assert children.taken[0].stopped_with == settings.drain_timeout_s
    paused = core.events("batch-1")[-1]
    assert (paused["type"], paused["reason"], paused["attempt"]) == ("paused", "free the GPU", 1)
    # Back to the end of its class's queue in the transaction that commits its claim: no preemption counted.
    back = core.fleet.moves[-1]
    assert (back.group, back.tp, back.offset) == (settings.group_id, claims_tp, claim.offset + 1)
    [requeued] = back.writes
    assert requeued.topic == settings.class_topics["batch"] and requeued.key == b"batch-1"
    assert dispatcher.retries.preemptions(requeued) == 0 and dispatcher.retries.read(requeued).attempt == 1
    assert core.partitions.committed[claims_tp] == claim.offset + 1
    await turns_until(lambda: not core.scheduler.jobs)

    # Its copy in the queue, held: not claimed again while its slot is free; resumed, it is.
    await turns(dispatcher)
    assert claims(core) == [b"batch-1"] and dispatcher.room() == 1
    await core.scheduler.control(Resume(request_id="batch-1"))
    await turns(dispatcher)
    assert claims(core) == [b"batch-1", b"batch-1"] and core.types("batch-1")[-1] == "released"
