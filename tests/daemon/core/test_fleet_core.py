"""The fleet's queue on the in-memory fakes (tests/fakes.py `FakeFleetKafka`), wired by `wire` as a host with
priority classes is: the turn (which class, then which team, a free slot takes), the claim (one transaction that
writes the signed claim and commits the queue past it, or, refused, neither), preemption (the job stopped, its
claim moved back to its class's queue with its signed count of preemptions, the slot given to the request that
preempted it) and the announcements (`queued` for a request no host has read). Milliseconds each; the real-broker
tests (tests/daemon/fleet/test_fleet_queue.py) keep what only a broker shows: transactions, a second host."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from daemon.fleet.announcer import Announcer
from daemon.fleet.dispatcher import Dispatcher
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER, TeamShare, queue_group
from handlers.protocol import StageEntered
from schemas.signing import new_key_pair
from tests.core import CoreOnFakes, turns_until
from tests.fakes import FakeChildren, FakeRecord, Script
from tests.helpers import sft_request

CLAIMS = TopicPartition("adapterd.claims", 0)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    retry_key = tmp_path / "retry-key"
    retry_key.write_bytes(b"the fleet's one retry key, long enough")
    return Settings(
        event_signing_key_file=key,
        retry_key_file=retry_key,
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        host="this-host",
        claims_topic=CLAIMS.topic,
        default_priority_class="default",
        priority_classes=[{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}],
        teams={"capped": TeamShare(max_slots=1)},
        preempt_min_run_s=0.0,
        queue_wait_event_s=0.0,
    )


def host(
    settings: Settings, children: FakeChildren | None = None, claims_partitions: int = 2
) -> tuple[CoreOnFakes, Dispatcher]:
    """A host as `wire` builds it, with its claims partitions (by default two: one for its slot, one to claim into
    while it is full)."""
    core = CoreOnFakes(settings, children=children)
    return core, core.fleet_host(claims_partitions)


def submit(
    core: CoreOnFakes, request_id: str, priority_class: str, team: str = "t", *, at_ms: int = 0, **more: Any
) -> FakeRecord:
    """A producer's request in its class's topic, arrived `at_ms` (the broker's append time)."""
    body = sft_request(request_id, priority_class=priority_class, team=team, **more)
    return core.fleet.produce(
        core.settings.class_topics[priority_class],
        request_id.encode(),
        json.dumps(body).encode(),
        timestamp=1_765_000_000_000 + at_ms,
    )


async def turns(dispatcher: Dispatcher, most: int = 5) -> None:
    """A host's turns: the first joins the queues and reads them, the next weighs what they hold."""
    for _ in range(most):
        await dispatcher.turn()


def claims(core: CoreOnFakes) -> list[bytes | None]:
    return [record.key for record in core.fleet.on(CLAIMS.topic)]


async def test_a_free_slot_takes_the_higher_class_then_the_lighter_team_and_the_claim_commits_the_queue_past_it(
    settings: Settings,
) -> None:
    core, dispatcher = host(settings.model_copy(update={"job_slots": 3}), claims_partitions=3)
    submit(core, "batch-first", "batch", at_ms=0)
    submit(core, "capped-1", "default", team="capped", at_ms=1)
    submit(core, "capped-2", "default", team="capped", at_ms=2)
    submit(core, "other-1", "default", team="other", at_ms=3)
    submit(core, "urgent-last", "urgent", at_ms=4)
    await turns(dispatcher)
    # Three slots: the urgent one first whatever its arrival, then the default class's first; `capped` holds its cap
    # of one with it, so `other` goes before capped-2; the batch one waits.
    assert claims(core) == [b"urgent-last", b"capped-1", b"other-1"]
    [urgent, *defaults] = core.fleet.on(CLAIMS.topic)
    sealed = dispatcher.mover.seal.read(CLAIMS.topic, urgent.partition, urgent.key, urgent.value, urgent.headers)
    assert (sealed.priority_class, dict(urgent.headers)[CLASS_HEADER]) == ("urgent", b"urgent")
    assert {urgent.partition, *(d.partition for d in defaults)} == {0, 1, 2}  # each into an idle claims partition
    # Each claim committed its queue's offset past it, in its own transaction.
    group = queue_group(settings.group_id, "urgent")
    assert core.fleet.offsets[(group, TopicPartition(settings.class_topics["urgent"], 0))] == 1
    assert [(move.group, [w.key for w in move.writes]) for move in core.fleet.moves] == [
        (group, [b"urgent-last"]),
        (queue_group(settings.group_id, "default"), [b"capped-1"]),
        (queue_group(settings.group_id, "default"), [b"capped-2", b"other-1"]),  # capped-2 written again behind it
    ]


async def test_a_refused_transaction_claims_nothing_and_the_request_is_claimed_at_a_later_turn(
    settings: Settings,
) -> None:
    core, dispatcher = host(settings)
    submit(core, "urgent-1", "urgent")
    core.fleet.refuse = RuntimeError("the broker aborted the transaction")
    with pytest.raises(RuntimeError):
        await turns(dispatcher)
    assert claims(core) == [] and core.fleet.offsets == {} and dispatcher.pending == {}
    core.fleet.refuse = None
    await turns(dispatcher)
    assert claims(core) == [b"urgent-1"]


async def test_an_urgent_request_preempts_the_batch_job_whose_request_goes_back_to_its_queue_with_a_signed_count(
    settings: Settings,
) -> None:
    children = FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True))
    core, dispatcher = host(settings, children)
    submit(core, "batch-1", "batch")
    await turns(dispatcher)
    [claim] = core.fleet.on(CLAIMS.topic)
    claims_tp = TopicPartition(CLAIMS.topic, claim.partition)
    await core.intake.take(claims_tp, [claim])  # the loop hands the claim to intake: the job starts
    await turns_until(lambda: children.hanging.is_set())
    assert core.types("batch-1")[:2] == ["accepted", "started"] and dispatcher.room() == 0
    submit(core, "urgent-1", "urgent")
    await turns(dispatcher)
    # The batch job is stopped for it at its checkpoint, and the urgent request claimed at once into the other
    # claims partition, where it waits for the slot.
    assert claims(core) == [b"batch-1", b"urgent-1"]
    assert core.fleet.on(CLAIMS.topic)[1].partition != claim.partition
    await turns_until(lambda: bool(children.taken[0].stops))
    assert children.taken[0].stopped_with == settings.drain_timeout_s
    await turns_until(lambda: "preempted" in core.types("batch-1"))
    preempted = core.events("batch-1")[-1]
    assert (preempted["type"], preempted["by"], preempted["preemptions"]) == ("preempted", "urgent-1", 1)
    # Back to the end of its class's queue, in the transaction that commits its claim: its count signed, no attempt
    # spent.
    back = core.fleet.moves[-1]
    assert (back.group, back.tp, back.offset) == (settings.group_id, claims_tp, claim.offset + 1)
    [requeued] = back.writes
    assert requeued.topic == settings.class_topics["batch"] and requeued.key == b"batch-1"
    assert dispatcher.retries.preemptions(requeued) == 1
    assert dispatcher.retries.read(requeued).attempt == 1
    assert core.partitions.committed[claims_tp] == claim.offset + 1
    await turns_until(lambda: not core.scheduler.jobs)  # its slot frees for the urgent request's claim


async def test_a_request_no_host_has_read_is_told_its_place_and_one_already_claimed_is_not(settings: Settings) -> None:
    core, dispatcher = host(settings)
    submit(core, "waiting-1", "batch", at_ms=0)
    submit(core, "waiting-2", "batch", at_ms=1)
    # waiting-1 claimed by another host: its queue group committed past it.
    core.fleet.offsets[(queue_group(settings.group_id, "batch"), TopicPartition(settings.class_topics["batch"], 0))] = 1
    announcer = Announcer(
        settings,
        dispatcher.view,
        core.publisher,
        core.partitions,
        dispatcher.retries,
        core.fleet.kafka().reads,
        core.scheduler.cancelled,
    )
    assert await announcer.announce() == 1
    [queued] = core.events("waiting-2")
    assert (queued["type"], queued["priority_class"], queued["place"]) == ("queued", "batch", 1)
    assert core.events("waiting-1") == []
    assert await announcer.announce() == 0  # told: not again while nothing moves


async def test_a_host_at_rest_decides_again_only_when_what_it_reads_changes_or_a_while_after(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host whose heads, room, claims and view are those of its last decision does not work out the fleet's order
    again at every turn (five a second), only `DECIDE_AGAIN_S` after it; a new request read, or an event folded into
    the view, is decided on at the next turn."""
    from daemon.fleet import dispatcher as dispatching

    core, dispatcher = host(settings.model_copy(update={"job_slots": 1}))
    clock = [1000.0]
    monkeypatch.setattr(dispatching.time, "time", lambda: clock[0])
    picks: list[int] = []
    pick = dispatcher.view.pick
    monkeypatch.setattr(dispatcher.view, "pick", lambda *a, **k: (picks.append(1), pick(*a, **k))[1])
    wide = sft_request("wide", priority_class="batch", team="t", resources={"gpus": 2})  # fits no slot of this host
    core.fleet.produce(settings.class_topics["batch"], b"wide", json.dumps(wide).encode(), timestamp=1_765_000_000_000)
    await turns(dispatcher)
    decided = len(picks)
    assert decided > 0 and claims(core) == []
    await turns(dispatcher, 10)
    assert len(picks) == decided  # nothing changed: no decision
    dispatcher.view.changes += 1  # an event folded into the view
    await turns(dispatcher, 1)
    assert len(picks) > decided
    decided = len(picks)
    clock[0] += dispatching.DECIDE_AGAIN_S
    await turns(dispatcher, 1)
    assert len(picks) > decided  # time alone, once DECIDE_AGAIN_S passed
    decided = len(picks)
    submit(core, "urgent-1", "urgent")
    await turns(dispatcher, 3)
    assert claims(core) == [b"urgent-1"]


async def test_the_announcer_works_out_the_same_requests_places_on_the_same_view_once_until_a_while_after(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The announcer's round works out the fleet's order of every unread request (thousands on a busy fleet): with the
    same requests on a view that folded nothing since, only `PLACE_AGAIN_S` after the last time; a new request, or an
    event folded, at the next round."""
    from daemon.fleet import announcer as announcing

    core, dispatcher = host(settings)
    clock = [2000.0]
    monkeypatch.setattr(announcing.time, "time", lambda: clock[0])
    monkeypatch.setattr(announcing, "ANNOUNCE_S", 0.0)
    submit(core, "waiting-1", "batch", at_ms=0)
    announcer = Announcer(
        settings, dispatcher.view, core.publisher, core.partitions, dispatcher.retries, core.fleet.kafka().reads
    )
    placings: list[int] = []
    places = dispatcher.view.places_beside

    async def counted(*args: Any, **kwargs: Any) -> Any:
        placings.append(1)
        return await places(*args, **kwargs)

    monkeypatch.setattr(dispatcher.view, "places_beside", counted)
    assert await announcer.announce() == 1 and len(placings) == 1
    for _ in range(2):
        clock[0] += 10.0  # past the telling's own RETELL_EVERY_S: it may be told again if its place moved
        assert await announcer.announce() == 0 and len(placings) == 1  # the same request, the same view: not again
    dispatcher.view.changes += 1  # an event folded
    await announcer.announce()
    assert len(placings) == 2
    clock[0] += announcing.PLACE_AGAIN_S
    await announcer.announce()
    assert len(placings) == 3  # the clock alone, once PLACE_AGAIN_S passed
    submit(core, "waiting-2", "batch", at_ms=1)
    await announcer.announce()
    assert len(placings) == 4 and [e["type"] for e in core.events("waiting-2")] == ["queued"]


async def test_an_urgent_request_bigger_than_the_host_preempts_the_batch_job_on_ray_which_ray_stops(
    settings: Settings, tmp_path: Path
) -> None:
    from daemon.children.routed import RoutedChildren
    from tests.daemon.core.test_ray_jobs import FakeJobs, Routed

    jobs = FakeJobs()
    routed = Routed(tmp_path, jobs)
    ray = {"address": "http://ray-head:8265", "shared_dir": str(tmp_path / "shared"), "max_gpus": 8, "retry_s": 0.01}
    with_ray = Settings.model_validate({**settings.model_dump(), "gpus": ["0"], "ray": ray})
    core = CoreOnFakes(with_ray, children=RoutedChildren(routed.local, routed.ray))
    dispatcher = core.fleet_host(2)
    submit(core, "batch-big", "batch", resources={"gpus": 2})
    await turns(dispatcher)
    [claim] = core.fleet.on(CLAIMS.topic)
    await core.intake.take(TopicPartition(CLAIMS.topic, claim.partition), [claim])
    await turns_until(lambda: "started" in core.types("batch-big"))
    batch_run = "adapterd-batch-big-a1"
    jobs.end(batch_run, "RUNNING")
    jobs.say(batch_run, 1, StageEntered(stage="train"))
    assert not core.slots.remote_free and core.slots.free == ["0"]  # the host's GPU free, of no use to it
    submit(core, "urgent-big", "urgent", resources={"gpus": 4})
    await turns(dispatcher)
    # Stopped through Ray's stop (its ranks save a checkpoint), and the urgent one claimed for its Ray slot: what it
    # needs of this host, though the job stopped had fewer GPUs than it asks (the cluster places them).
    assert claims(core) == [b"batch-big", b"urgent-big"]
    await turns_until(lambda: "preempted" in core.types("batch-big"))
    assert jobs.stopped == [batch_run]
    preempted = core.events("batch-big")[-1]
    assert (preempted["by"], preempted["preemptions"]) == ("urgent-big", 1)
    assert core.fleet.moves[-1].writes[0].topic == with_ray.class_topics["batch"]  # back in its class's queue
    urgent = core.fleet.on(CLAIMS.topic)[1]
    await core.intake.take(TopicPartition(CLAIMS.topic, urgent.partition), [urgent])
    await turns_until(lambda: "adapterd-urgent-big-a1" in jobs.jobs)  # in the Ray slot the batch job freed
