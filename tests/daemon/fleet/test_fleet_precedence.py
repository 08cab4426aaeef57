"""Precedence that never inverts (issue 57): no free slot goes to a lower class while a higher class's request that
fits it waits where the host can read it. On the in-memory fakes: a team's cap counts this host's own claims and
freed slots at once, not when their events are read back; a full host whose jobs are all younger than
`preempt_min_run_s` still reads the higher classes' arrivals (it preempts only once the minimum has passed); a
request read in another class's topic is weighed as its own class, not moved out of the turn. Milliseconds."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition

from daemon.fleet.dispatcher import Dispatcher
from daemon.jobs.offered import RunningJob
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER, TeamShare, queue_group
from schemas import Accepted, Cancelled
from schemas.signing import new_key_pair
from tests.core import CoreOnFakes
from tests.daemon.fleet.test_queue_dispatch import CLAIMS, Moves, turns
from tests.fakes import FakeFleetKafka, FakeQueueConsumer, FakeRecord
from tests.helpers import sft_request

CLAIMS_1 = TopicPartition(CLAIMS.topic, 1)
HOST = "this-host"


class AnsweredMidPoll(FakeQueueConsumer):
    """A partition whose first fetch's answer comes in while the poll is under way: its high watermark is known at
    once, its records only at the next poll."""

    def __init__(self, fleet: FakeFleetKafka, group: str) -> None:
        super().__init__(fleet, group)
        self.answered = False

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[FakeRecord]]:
        if self.assigned and not self.answered:
            self.answered = True
            return {}
        return await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)

    def highwater(self, tp: TopicPartition) -> int | None:
        return super().highwater(tp) if self.answered else None


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    return Settings(
        event_signing_key_file=key,
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        host=HOST,
        claims_topic=CLAIMS.topic,
        default_priority_class="default",
        priority_classes=[{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}],
        teams={"t": TeamShare(max_slots=1)},
    )


def request(
    settings: Settings, request_id: str, priority_class: str, team: str, offset: int, topic_of: str | None = None
) -> FakeRecord:
    """A request of `team` and `priority_class`, in the topic of class `topic_of` (its own class's by default)."""
    body = json.dumps(sft_request(request_id, priority_class=priority_class, team=team)).encode()
    topic = settings.class_topics[topic_of or priority_class]
    return FakeRecord(topic, 0, offset, request_id.encode(), body, timestamp=1_765_000_000_000 + offset)


def host(
    settings: Settings, records: list[FakeRecord], fleet: FakeFleetKafka | None = None
) -> tuple[Dispatcher, Moves, CoreOnFakes]:
    """This host's dispatcher, as `wire` builds it, over the class topics holding `records`, with two claims
    partitions."""
    core = CoreOnFakes(settings, fleet=fleet)
    dispatcher = core.fleet_host(2, records)
    return dispatcher, Moves(core.fleet, dispatcher.mover.seal), core


def job_here(
    dispatcher: Dispatcher,
    core: CoreOnFakes,
    request_id: str,
    priority_class: str,
    team: str,
    *,
    slots_freed: bool = False,
    ran_s: float = 1.0,
    tp: TopicPartition = CLAIMS,
    gpus: int = 1,
    steps_since_checkpoint: int | None = None,
) -> None:
    """A job of this host on claims partition `tp`, begun `ran_s` ago: its slot held (a Ray slot when it asks more GPUs
    than the host has, tests/daemon/fleet/test_fleet_ray.py), or given back (its child exited, its outcome not yet
    published); `steps_since_checkpoint` past its last checkpoint when given; the view has read its `accepted`."""
    body = sft_request(request_id, priority_class=priority_class, team=team, resources={"gpus": gpus})
    claim = FakeRecord(
        tp.topic,
        tp.partition,
        0,
        request_id.encode(),
        json.dumps(body).encode(),
        [(CLASS_HEADER, priority_class.encode())],
    )
    progress, saved = ({}, None) if steps_since_checkpoint is None else ({"step": 10 + steps_since_checkpoint}, 10)
    runner: Any = SimpleNamespace(
        request=core.request(claim),
        supervisor=SimpleNamespace(progress=progress, checkpoint_step=saved),
        stop=lambda stop: True,
    )
    placement = (
        None if slots_freed else core.slots.take_remote() if gpus > core.slots.total else core.slots.take(gpus, None)
    )
    core.scheduler.jobs[tp] = RunningJob(request_id, 0, runner, placement, None)  # type: ignore[arg-type]
    dispatcher.jobs.started[tp] = (time.time() - ran_s, claim)
    dispatcher.view.observe(
        Accepted(
            request_id=request_id,
            host=core.settings.host,
            method="sft",
            priority_class=priority_class,
            team=team,
            host_slots=core.slots.total,
        ),
        time.time(),
    )


def claimed(mover: Moves) -> list[str | None]:
    return [key for key, _ in mover.claims()]


async def test_a_slot_freed_by_a_capped_teams_own_job_goes_to_that_teams_urgent_request_not_a_batch_one(
    settings: Settings,
) -> None:
    # Route (a): the slot frees when the child exits, before the job's `succeeded` is published and read back.
    records = [request(settings, "batch-first", "batch", "other", 0), request(settings, "urgent-t", "urgent", "t", 0)]
    dispatcher, mover, core = host(settings, records)
    job_here(dispatcher, core, "t-running", "urgent", "t", slots_freed=True)
    assert dispatcher.view.usage.running() == {"t": 1}  # what the events say: t at its cap
    await turns(dispatcher, lambda: bool(mover.moves))
    assert claimed(mover) == ["urgent-t"]


async def test_a_job_whose_end_this_host_published_holds_no_slot_before_the_end_is_read_back(
    settings: Settings,
) -> None:
    records = [request(settings, "batch-first", "batch", "other", 0), request(settings, "urgent-t", "urgent", "t", 0)]
    dispatcher, mover, core = host(settings, records)
    job_here(dispatcher, core, "t-running", "urgent", "t", slots_freed=True)
    ended = Cancelled(request_id="t-running", host=HOST, reason="by its owner")
    await core.publisher.publish(ended)  # its end is sent, then the scheduler forgets the job...
    del core.scheduler.jobs[CLAIMS]
    await turns(dispatcher, lambda: bool(mover.moves))  # ...before the view reads the end back
    assert claimed(mover) == ["urgent-t"]
    dispatcher.view.observe(ended, time.time())  # read back: the events say it now, and the host forgets its own note
    assert dispatcher.view.ended_here == {} and dispatcher.view.usage.running() == {}


async def test_two_slots_free_in_one_turn_give_a_capped_team_no_more_than_its_cap(settings: Settings) -> None:
    settings = settings.model_copy(update={"job_slots": 2})
    records = [
        request(settings, "urgent-t-1", "urgent", "t", 0),
        request(settings, "urgent-t-2", "urgent", "t", 1),
        request(settings, "batch-other", "batch", "other", 0),
    ]
    dispatcher, mover, _ = host(settings, records)
    await turns(dispatcher, lambda: len(mover.claims()) == 2)
    assert claimed(mover) == ["urgent-t-1", "batch-other"]  # the first claim counts at once against t's cap of 1


async def test_a_full_host_whose_jobs_are_all_too_young_to_preempt_reads_a_higher_class_and_preempts_once_they_are_not(
    settings: Settings,
) -> None:
    # Route (b): every job younger than preempt_min_run_s; the host had left the higher classes' queues.
    dispatcher, mover, core = host(settings, [request(settings, "urgent-u", "urgent", "u", 0)])
    job_here(dispatcher, core, "batch-young", "batch", "other", ran_s=5.0)
    assert dispatcher.room() == 0 and settings.preempt_min_run_s > 5
    for _ in range(3):
        await dispatcher.turn()
    urgent, default, batch = dispatcher.queues
    assert (
        urgent.subscribed and default.subscribed and not batch.subscribed
    )  # default's topic, where `submit` writes any class
    assert [h.request_id for h in urgent.heads()] == ["urgent-u"]  # read at once...
    assert not mover.moves and CLAIMS not in dispatcher.jobs.preempting  # ...preempting nothing before the minimum
    dispatcher.jobs.started[CLAIMS] = (time.time() - settings.preempt_min_run_s - 1, dispatcher.jobs.started[CLAIMS][1])
    await dispatcher.turn()
    assert dispatcher.jobs.preempting == {CLAIMS: "urgent-u"} and claimed(mover) == ["urgent-u"]


async def test_a_full_host_reads_the_default_classs_topic_for_the_higher_classes_written_there(
    settings: Settings,
) -> None:
    # `adapterd submit` writes every request to `requests_topic`, the default class's, whence it is moved to its
    # class's: with the default class the lowest, a full host still reads it for the urgent requests that arrive there.
    settings = settings.model_copy(
        update={
            "priority_classes": Settings(
                priority_classes=[{"name": "urgent"}, {"name": "default", "preemptible": True}],
                event_signing_key_file=settings.event_signing_key_file,
            ).priority_classes
        }
    )
    dispatcher, mover, core = host(settings, [request(settings, "urgent-u", "urgent", "u", 0, topic_of="default")])
    job_here(dispatcher, core, "default-young", "default", "other", ran_s=5.0)
    for _ in range(3):
        await dispatcher.turn()
    assert [q.name for q in dispatcher.queues if q.subscribed] == ["urgent", "default"]
    [moved] = [write for move in mover.moves for write in move.writes]
    sealed = mover.seal.read(moved.topic, moved.partition, moved.key, moved.value, moved.headers)
    assert (moved.topic, sealed.priority_class) == (settings.class_topics["urgent"], "urgent")


async def test_a_full_host_leaves_a_higher_class_to_the_hosts_with_room_until_it_may_preempt(
    settings: Settings,
) -> None:
    # The cost of reading while full: a full member holds its share of the partitions, where a request would wait
    # for the minimum run while another host has a free slot. While the events say one has, it does not read.
    dispatcher, _, core = host(settings, [request(settings, "urgent-u", "urgent", "u", 0)])
    job_here(dispatcher, core, "batch-young", "batch", "other", ran_s=5.0)
    dispatcher.view.observe(
        Accepted(
            request_id="elsewhere", host="other-host", method="sft", priority_class="batch", team="other", host_slots=2
        ),
        time.time(),
    )
    await dispatcher.turn()
    assert not any(queue.subscribed for queue in dispatcher.queues)
    dispatcher.jobs.started[CLAIMS] = (time.time() - settings.preempt_min_run_s - 1, dispatcher.jobs.started[CLAIMS][1])
    await dispatcher.turn()  # it may preempt now: it reads the class it may preempt for, as before
    assert [q.name for q in dispatcher.queues if q.subscribed] == ["urgent", "default"]


async def test_a_full_host_whose_jobs_are_too_young_leaves_a_higher_class_to_a_host_whose_job_may_be_stopped_now(
    settings: Settings,
) -> None:
    dispatcher, _, core = host(settings, [request(settings, "urgent-u", "urgent", "u", 0)])
    job_here(dispatcher, core, "batch-young", "batch", "other", ran_s=5.0)
    long_ago = datetime.now(UTC) - timedelta(seconds=settings.preempt_min_run_s + 60)
    dispatcher.view.observe(
        Accepted(
            request_id="batch-old",
            host="other-host",
            method="sft",
            priority_class="batch",
            team="other",
            host_slots=1,
            time=long_ago,
        ),
        time.time(),
    )
    await dispatcher.turn()
    assert not any(
        queue.subscribed for queue in dispatcher.queues
    )  # the other host reads it, and stops its job for it at once


async def test_an_urgent_request_read_in_the_default_topic_takes_the_free_slot_before_a_batch_one(
    settings: Settings,
) -> None:
    # Route (b), second half: moved to its class's topic first, it left the turn, and the slot went to a batch request.
    records = [
        request(settings, "batch-first", "batch", "other", 0),
        request(settings, "urgent-via-submit", "urgent", "u", 0, topic_of="default"),
    ]
    dispatcher, mover, _ = host(settings, records)
    await turns(dispatcher, lambda: bool(mover.claims()))
    assert claimed(mover) == ["urgent-via-submit"]
    assert [write.topic for move in mover.moves for write in move.writes] == [
        CLAIMS.topic
    ]  # claimed where it was, not moved


async def test_a_queue_whose_first_answer_came_in_while_the_turn_polled_is_read_before_its_slot_goes_to_a_lower_class(
    settings: Settings,
) -> None:
    # After a join: the urgent queue's first fetch is answered during the poll (its records not yet in its window).
    # Counted as known by its high watermark alone, the turn gave the free slot to the batch request it had read.
    records = [request(settings, "batch-first", "batch", "other", 0), request(settings, "urgent-u", "urgent", "u", 0)]
    fleet = FakeFleetKafka()
    urgent = queue_group(settings.group_id, "urgent")
    fleet.consumers[urgent] = AnsweredMidPoll(fleet, urgent)
    dispatcher, mover, _ = host(settings, records, fleet)
    await turns(dispatcher, lambda: bool(mover.claims()))
    assert claimed(mover) == ["urgent-u"]
