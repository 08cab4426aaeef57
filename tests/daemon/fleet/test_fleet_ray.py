"""The fleet with priority classes and a Ray cluster (`[ray]`): a host's dispatcher claims a request bigger than itself
(or naming several hosts) for a free Ray slot of its own, in the fleet's order, beside what its GPUs take, and no
more of them than it supervises at once (`ray.max_jobs`). A preemption stops a job where it frees what the request
needs: a job on Ray for a request bigger than the host (its Ray slot, whatever its GPUs), a job on the host's GPUs
for any other (a job on Ray frees none of them); and a job on Ray holds none of its host's slots in the fleet's ETAs.
On the fakes."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from daemon.fleet.policy.eta import etas
from daemon.fleet.policy.order import FleetJob, FleetRequest
from daemon.settings import Settings
from schemas import Accepted, Started
from tests.core import CoreOnFakes
from tests.daemon.fleet.test_fleet_eta import NOW, known
from tests.daemon.fleet.test_fleet_kinds import record
from tests.daemon.fleet.test_fleet_precedence import job_here
from tests.daemon.fleet.test_queue_dispatch import CLAIMS, Moves, fleet_settings, turns  # noqa: F401 (a fixture)
from tests.fakes import FakeRecord
from tests.helpers import sft_request

CLAIMS_1, CLAIMS_2 = TopicPartition(CLAIMS.topic, 1), TopicPartition(CLAIMS.topic, 2)


@pytest.fixture
def ray_host(fleet_settings: Settings, tmp_path: Path) -> Settings:  # noqa: F811 (the fixture above)
    ray = {"address": "http://ray-head:8265", "shared_dir": str(tmp_path / "shared"), "max_gpus": 8}
    return Settings.model_validate({**fleet_settings.model_dump(), "gpus": ["0"], "ray": ray})


async def test_a_host_claims_a_request_bigger_than_itself_for_its_ray_slot_beside_one_for_its_gpu(
    ray_host: Settings,
) -> None:
    # Two bigger than the host (4 GPUs; it has one) ahead of one that fits its GPU.
    records = [record(0, "big-1", gpus=4), record(1, "big-2", gpus=4), record(2, "small", gpus=1)]
    core = CoreOnFakes(ray_host)
    dispatcher = core.fleet_host(3, records)  # claims partitions enough for every request: its slots decide
    mover = Moves(core.fleet, dispatcher.mover.seal)
    await turns(dispatcher, lambda: len(mover.claims()) == 2)
    for _ in range(5):
        await dispatcher.turn()
    # The first big one for its one Ray slot (ray.max_jobs), the small one for its GPU; big-2 waits for a Ray slot.
    assert sorted(key for key, _ in mover.claims()) == ["big-1", "small"]
    assert not [e for e in core.events() if e["type"] == "rejected"]


async def test_a_host_claims_a_request_naming_two_hosts_for_its_ray_slot_though_its_gpus_would_hold_it(
    ray_host: Settings,
) -> None:
    # A host of two GPUs: the request across two hosts asks no more than that, and still goes to Ray, leaving them
    # to the request behind it.
    two_gpus = ray_host.model_copy(update={"gpus": ["0", "1"]})
    records = [record(0, "spread", gpus=2, hosts=2), record(1, "here", gpus=2)]
    core = CoreOnFakes(two_gpus)
    dispatcher = core.fleet_host(3, records)  # claims partitions enough for every request: its slots decide
    mover = Moves(core.fleet, dispatcher.mover.seal)
    await turns(dispatcher, lambda: len(mover.claims()) == 2)
    assert sorted(key for key, _ in mover.claims()) == ["here", "spread"]


@pytest.fixture
def classes_host(ray_host: Settings) -> Settings:
    """`ray_host` with a preemptible class below the others, its jobs old enough to be stopped."""
    classes = [{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}]
    return Settings.model_validate({**ray_host.model_dump(), "priority_classes": classes})


def waiting(settings: Settings, request_id: str, offset: int, gpus: int) -> FakeRecord:
    body = sft_request(request_id, priority_class="urgent", team=request_id, resources={"gpus": gpus})
    topic = settings.class_topics["urgent"]
    return FakeRecord(topic, 0, offset, request_id.encode(), json.dumps(body).encode(), timestamp=1_765_000_000_000)


async def test_a_request_bigger_than_the_host_preempts_a_lower_classs_job_on_ray_smaller_than_itself(
    classes_host: Settings,
) -> None:
    core = CoreOnFakes(classes_host)
    dispatcher = core.fleet_host(3, [waiting(classes_host, "urgent-big", 0, gpus=4)])
    # The host's one Ray slot holds a batch job of two GPUs; its own GPU is free, and no use to a job of four.
    job_here(
        dispatcher, core, "batch-ray", "batch", "batch-ray", tp=CLAIMS, gpus=2, steps_since_checkpoint=3, ran_s=3600
    )
    mover = Moves(core.fleet, dispatcher.mover.seal)
    await turns(dispatcher, lambda: bool(mover.claims()))
    # Its Ray slot is what the request needs: the cluster places the GPUs of the job it runs there.
    assert dispatcher.jobs.preempting == {CLAIMS: "urgent-big"}
    assert [key for key, _ in mover.claims()] == ["urgent-big"]


async def test_a_request_for_the_hosts_gpu_preempts_the_job_on_it_not_one_on_ray_that_would_lose_less(
    classes_host: Settings,
) -> None:
    core = CoreOnFakes(classes_host)
    dispatcher = core.fleet_host(3, [waiting(classes_host, "urgent-small", 0, gpus=1)])
    job_here(
        dispatcher, core, "batch-gpu", "batch", "batch-gpu", tp=CLAIMS, gpus=1, steps_since_checkpoint=7, ran_s=3600
    )
    # At its checkpoint: of the two the one that loses least, but stopping it frees a Ray slot, not the host's GPU.
    job_here(
        dispatcher, core, "batch-ray", "batch", "batch-ray", tp=CLAIMS_1, gpus=2, steps_since_checkpoint=0, ran_s=3600
    )
    mover = Moves(core.fleet, dispatcher.mover.seal)
    await turns(dispatcher, lambda: bool(mover.claims()))
    assert dispatcher.jobs.preempting == {CLAIMS: "urgent-small"}


async def test_a_request_bigger_than_the_host_with_nothing_to_stop_on_ray_holds_up_no_preemption_behind_it(
    classes_host: Settings,
) -> None:
    # First in the order, the big one finds its Ray slot held by a job of its own class: nothing it may stop there.
    records = [waiting(classes_host, "urgent-big", 0, gpus=4), waiting(classes_host, "urgent-small", 1, gpus=1)]
    core = CoreOnFakes(classes_host)
    dispatcher = core.fleet_host(3, records)
    job_here(
        dispatcher, core, "batch-gpu", "batch", "batch-gpu", tp=CLAIMS, gpus=1, steps_since_checkpoint=7, ran_s=3600
    )
    job_here(
        dispatcher,
        core,
        "urgent-ray",
        "urgent",
        "urgent-ray",
        tp=CLAIMS_1,
        gpus=2,
        steps_since_checkpoint=0,
        ran_s=3600,
    )
    mover = Moves(core.fleet, dispatcher.mover.seal)
    await turns(dispatcher, lambda: bool(mover.claims()))
    for _ in range(3):
        await dispatcher.turn()
    assert dispatcher.jobs.preempting == {CLAIMS: "urgent-small"}
    assert [key for key, _ in mover.claims()] == ["urgent-small"]  # the big one waits for its Ray slot


def test_a_job_on_ray_holds_none_of_the_fleets_slots_in_the_etas_but_its_teams_share() -> None:
    on_ray = FleetJob("big", "batch", "a", NOW, "sft", "tiny", gpus=4, on_ray=True)  # ends in 100 s, as its kind does
    assert etas([FleetRequest("w1", "batch", "b", NOW, "sft", "tiny")], [on_ray], 1, known(), NOW) == {"w1": 0.0}
    # Its GPUs count against its team's cap, as they do in the fleet's fair share: team a's request waits for its end.
    capped = Settings(teams={"a": {"max_slots": 4}}).teams
    assert etas([FleetRequest("w2", "batch", "a", NOW, "sft", "tiny")], [on_ray], 1, known(), NOW, capped) == {
        "w2": 100.0
    }


def test_a_host_whose_job_runs_on_ray_can_still_start_a_request_on_its_gpu_as_the_events_say(
    classes_host: Settings,
) -> None:
    view = CoreOnFakes(classes_host).fleet_host(1).view
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    for event in (
        Accepted(
            request_id="batch-ray",
            host="other-host",
            method="sft",
            priority_class="batch",
            team="other",
            host_slots=1,
            time=long_ago,
        ),
        Started(request_id="batch-ray", host="other-host", method="sft", slot="ray", pid=None, gpus=4, time=long_ago),
    ):
        view.observe(event, time.time())
    [job] = view.running_jobs.jobs(time.time())
    assert job.on_ray and job.gpus == 4  # as `started` said: four GPUs of the cluster's
    # Its GPU is free: a request of one GPU can start there now, no preemption needed (of the batch class, it may stop
    # nothing); four GPUs counted against that one slot, it could not.
    small = FleetRequest("", "batch", "", 0.0, "", "", 1)
    assert view.startable_elsewhere(classes_host.host, small)
    # One bigger than a host can start there by stopping the batch job on Ray (its Ray slot, whatever its GPUs).
    big = FleetRequest("", "urgent", "", 0.0, "", "", 8)
    assert view.startable_elsewhere(classes_host.host, big, on_ray=True)
    assert not view.startable_elsewhere(classes_host.host, replace(big, priority_class="batch"), on_ray=True)
