"""The dispatcher's decisions on the in-memory fakes (issue 61): a flood of undecodable records in a class's
queue is dead-lettered where it is, a window at a time, costing no claim and no rejoin, and the valid
request behind it is claimed, signed by the fleet; a backdated record does not go first. Milliseconds."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from daemon.fleet.dispatcher import Dispatcher
from daemon.kafka.queue_seal import QueueSeal
from daemon.settings import Settings
from daemon.settings.fleet import queue_group
from schemas import Accepted, Cancel, Progress, Queued
from schemas.signing import new_key_pair
from tests.core import CoreOnFakes
from tests.daemon.fleet.test_fleet_queues import CLASSES, TP
from tests.daemon.fleet.test_fleet_usage import T0, read, succeeded
from tests.fakes import FakeFleetKafka, FakeQueueConsumer, FakeRecord, Moved
from tests.helpers import sft_request

CLAIMS = TopicPartition("adapterd.claims", 0)


class Moves:
    """The fleet's transactions (tests/fakes.py `FakeFleetKafka`) as these tests read them."""

    def __init__(self, fleet: FakeFleetKafka, seal: QueueSeal) -> None:
        self.fleet, self.seal = fleet, seal

    @property
    def moves(self) -> list[Moved]:
        return self.fleet.moves

    def claims(self) -> list[tuple[str | None, list[tuple[str, bytes | None]]]]:
        """The claims written: each one's key and headers, signed as the fleet signs them."""
        return [(r.key.decode() if r.key else None, r.headers) for r in self.fleet.on(CLAIMS.topic)]


@pytest.fixture
def fleet_settings(tmp_path: Path) -> Settings:
    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    settings = Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        priority_classes=CLASSES,
        default_priority_class="default",
        claims_topic=CLAIMS.topic,
        event_signing_key_file=key,
    )
    assert settings.class_topics["batch"] == TP.topic
    return settings


def dispatcher_over(
    settings: Settings, records: list[FakeRecord]
) -> tuple[Dispatcher, Moves, CoreOnFakes, FakeQueueConsumer]:
    """This host's dispatcher, as `wire` builds it, over the fleet's Kafka in memory holding `records` (offsets from 0
    in each partition), with one claims partition; and the batch class's queue consumer."""
    core = CoreOnFakes(settings)
    dispatcher = core.fleet_host(1, records)  # one claims partition
    batch = core.fleet.queue_consumer(queue_group(settings.group_id, "batch"))
    return dispatcher, Moves(core.fleet, dispatcher.mover.seal), core, batch


async def turns(dispatcher: Dispatcher, until: Callable[[], bool], most: int = 50) -> int:
    for number in range(1, most + 1):
        await dispatcher.turn()
        if until():
            return number
    raise AssertionError("never got there")


def valid(offset: int, request_id: str, timestamp: int = 1_765_000_000_000, team: str | None = None) -> FakeRecord:
    body = json.dumps(sft_request(request_id, priority_class="batch", **({"team": team} if team else {}))).encode()
    return FakeRecord(TP.topic, 0, offset, request_id.encode(), body, timestamp=timestamp)


async def test_a_flood_of_undecodable_records_is_dead_lettered_a_window_at_a_time_and_the_valid_one_behind_it_is_claimed(  # noqa: E501 (the test's name says what it checks)
    fleet_settings: Settings,
) -> None:
    flood = [FakeRecord(TP.topic, 0, offset, b"flood", b"not a request %d" % offset) for offset in range(200)]
    dispatcher, mover, core, batch = dispatcher_over(fleet_settings, [*flood, valid(200, "after-flood")])
    taken = await turns(dispatcher, lambda: bool(mover.claims()))
    assert [key for key, _ in mover.claims()] == ["after-flood"]  # not one claim for the 200
    [(_, headers)] = mover.claims()
    sealed = mover.seal.read(CLAIMS.topic, CLAIMS.partition, b"after-flood", valid(200, "after-flood").value, headers)
    assert sealed.priority_class == "batch" and sealed.partition == CLAIMS.partition
    letters = core.dead_letters()
    assert len(letters) == 200 and {letter.header("adapterd-reason") for letter in letters} == {b"not_json"}
    assert [event["reason"] for event in core.events() if event["type"] == "rejected"] == ["not_json"] * 200
    # One transaction a window commits past its rejected records, writing nothing; then the claim.
    assert [len(move.writes) for move in mover.moves] == [0] * 7 + [1] and taken <= 8
    assert batch.joins == 1 and batch.leaves <= 1  # no rejoin for them: the host left once, full with the valid one


async def test_a_record_backdated_to_1970_is_not_picked_before_one_read_earlier(fleet_settings: Settings) -> None:
    dispatcher, mover, _, batch = dispatcher_over(fleet_settings, [valid(0, "on-time")])
    reads = iter([1_765_000_000.0, 1_765_000_001.0])
    dispatcher.heads.arrivals.clock = lambda: next(
        reads
    )  # this host's first read of each (a topic made by hand: CreateTime)
    for queue in dispatcher.queues:
        queue.joined = False  # a turn right after joining only reads
    await dispatcher.turn()
    assert not mover.moves and [h.request_id for h in dispatcher.queues[2].heads()] == ["on-time"]
    batch.fleet.log(TP).append(valid(1, "backdated", timestamp=0))  # its producer's clock says 1970
    for queue in dispatcher.queues:
        queue.joined = True
    await turns(dispatcher, lambda: bool(mover.claims()))
    assert [key for key, _ in mover.claims()] == ["on-time"]


async def test_a_request_cancelled_in_the_queue_ends_within_a_turn_unclaimed_and_is_not_counted_in_the_others_places(
    fleet_settings: Settings,
) -> None:
    """Issue 57: a cancelled request was claimed like any other (a free slot, a claims partition of its own) and
    skipped only when the scheduler read its claim; meanwhile the others' `queued` events counted it ahead of them."""
    settings = fleet_settings.model_copy(
        update={"queue_wait_event_s": 0.0}
    )  # the one still waiting is told its place at once
    dispatcher, mover, core, _ = dispatcher_over(
        settings, [valid(0, "ahead-1"), valid(1, "cancelled-1"), valid(2, "behind-1"), valid(3, "behind-2")]
    )
    reads = iter(range(1_765_000_000, 1_765_000_100))
    dispatcher.heads.arrivals.clock = lambda: float(next(reads))  # arrival in offset order
    await core.scheduler.cancel(Cancel(request_id="cancelled-1", reason="sweep withdrawn"))
    # The first turn joins the queues and reads them (a turn right after a join weighs nothing); the next ends it.
    assert await turns(dispatcher, lambda: bool(core.events("cancelled-1"))) == 2
    assert [(event["type"], event["reason"]) for event in core.events("cancelled-1")] == [
        ("cancelled", "sweep withdrawn")
    ]
    # The first move commits past it, writing ahead-1 (before it in the window) again; no claim of it, ever.
    first = mover.moves[0]
    assert (first.tp, first.offset) == (TP, 2) and [write.key for write in first.writes] == [b"ahead-1"]
    assert first.writes[0].topic == TP.topic and first.writes[0].partition == TP.partition
    assert [key for key, _ in mover.claims()] == ["behind-1"]  # the host's one slot: the first left in the order
    # behind-2 waits, told place 1: cancelled-1 is not counted ahead of it (ahead-1's copy is not read back: the fake
    # mover only keeps its moves).
    assert [(event["request_id"], event["place"]) for event in core.events() if event["type"] == "queued"] == [
        ("behind-2", 1)
    ]


async def test_a_head_held_by_its_teams_cap_is_told_again_with_an_eta_that_counts_the_cap(
    fleet_settings: Settings,
) -> None:
    """Issue 57: a head held by its team's `max_slots` was told ETA 0 s, and never told again. Team t may hold one slot
    and runs run-1 on gpu-b for 13 s more; gpu-b's other slot is free. Another host told held-1, 40 s ago, that it
    would start in 30 s: this host, holding it, tells it again, its ETA now the 13 s to run-1's end."""
    capped = fleet_settings.model_copy(
        update={"teams": Settings(teams={"t": {"max_slots": 1}}).teams, "queue_wait_event_s": 0.0}
    )
    dispatcher, mover, core, _ = dispatcher_over(capped, [valid(0, "held-1", team="t")])
    now = time.time()
    view = dispatcher.view
    view.observe(
        read(
            Accepted(
                request_id="run-1",
                method="sft",
                team="t",
                priority_class="batch",
                host_slots=2,
                host="gpu-b",
                time=datetime.fromtimestamp(now - 60, UTC),
            )
        ),
        now,
    )
    view.observe(
        read(
            Progress(
                request_id="run-1",
                step=10,
                total_steps=50,
                eta_s=13.0,
                host="gpu-b",
                time=datetime.fromtimestamp(now, UTC),
            )
        ),
        now,
    )
    view.observe(
        read(
            Queued(
                request_id="held-1",
                priority_class="batch",
                team="t",
                place=1,
                eta_s=30.0,
                host="gpu-c",
                time=datetime.fromtimestamp(now - 40, UTC),
            )
        ),
        now,
    )
    await turns(dispatcher, lambda: bool(core.events("held-1")))
    assert not mover.claims()  # its team is at its cap: it waits
    [queued] = core.events("held-1")
    assert (queued["type"], queued["place"], queued["eta_s"]) == ("queued", 1, pytest.approx(13.0, abs=1))
    await dispatcher.turn()
    assert len(core.events("held-1")) == 1  # told: not again within RETELL_EVERY_S, nor while nothing moves


async def test_the_request_behind_a_claim_of_this_hosts_last_slot_is_told_it_waits_for_that_job_not_0_s(
    fleet_settings: Settings,
) -> None:
    """Issue 57: a head was told ETA 0 s in the turn this host gave its one slot to the request ahead of it (the claim's
    `accepted` not yet read back, the ETAs saw the slot free), then waited that whole job.
    Jobs of its kind take 20 s."""
    told = fleet_settings.model_copy(update={"queue_wait_event_s": 0.0})
    dispatcher, mover, core, _ = dispatcher_over(told, [valid(0, "first-1"), valid(1, "next-1")])
    now = time.time()
    dispatcher.view.observe(succeeded("done-1", now - 100 - T0, durations_s={"total": 20.0}), now)
    assert dispatcher.room() == 1
    await turns(dispatcher, lambda: bool(core.events("next-1")))
    assert [key for key, _ in mover.claims()] == ["first-1"]
    [queued] = core.events("next-1")
    assert (queued["type"], queued["place"]) == ("queued", 1)
    assert queued["eta_s"] == pytest.approx(20.0, abs=2)  # first-1's expected 20 s, from now


async def test_the_first_turn_waits_for_the_fleets_view_to_be_whole(fleet_settings: Settings) -> None:
    """A restarted host decides nothing until its view of the fleet is loaded (`FleetView.caught_up`): from an empty
    view every team is idle and under its cap."""
    dispatcher, mover, _, _ = dispatcher_over(fleet_settings, [valid(0, "first")])
    stopping = asyncio.Event()
    running = asyncio.create_task(dispatcher.run(stopping))
    try:
        for _ in range(2000):  # turns enough to claim it (below, once the view is whole)
            dispatcher.wake.set()
            await asyncio.sleep(0)
        assert not mover.moves and not running.done()
        dispatcher.view.caught_up.set()
        for _ in range(2000):
            dispatcher.wake.set()  # a turn now, not after TURN_S
            await asyncio.sleep(0)
        assert [key for key, _ in mover.claims()] == ["first"]
    finally:
        stopping.set()
        dispatcher.wake.set()
        await asyncio.wait_for(running, 10)
