"""The fleet with GPUs of several kinds (daemon/fleet/policy/kinds.py): the ETAs place a request that asks for a kind or
a GPU's memory only on slots that serve it; a host's dispatcher claims only what its GPUs serve, leaving the rest in
the queue for a host that can, held up by none; a host says its kind in its `accepted` events, which every host folds;
and a request no declared kind serves is rejected where it waits."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from daemon.admission.gpu_kinds import GpuNeed
from daemon.fleet.policy.eta import Bounds, etas, places, preempting
from daemon.fleet.policy.kinds import SlotKinds, slot_kinds
from daemon.fleet.policy.order import FleetJob, FleetRequest
from daemon.fleet.policy.usage import Durations
from daemon.fleet.view import FleetView
from daemon.settings import Settings
from daemon.settings.fleet import PriorityClass
from schemas import Accepted
from schemas.signing import new_key_pair
from tests.daemon.fleet.test_fleet_queues import CLASSES, TP
from tests.daemon.fleet.test_fleet_usage import at, read
from tests.daemon.fleet.test_queue_dispatch import CLAIMS, dispatcher_over, turns
from tests.fakes import FakeRecord
from tests.helpers import sft_request

NOW = 1_800_000_000.0
H100 = GpuNeed(("h100-80gb",))
# One L4 host and one H100 host, one slot each.
FLEET = SlotKinds(
    {"l4-24gb": 1, "h100-80gb": 1}, {"l4": "l4-24gb", "h100": "h100-80gb"}, {"l4-24gb": 24.0, "h100-80gb": 80.0}
)


def waiting(request_id: str, need: GpuNeed | None = None) -> FleetRequest:
    return FleetRequest(request_id, "batch", "a", NOW, "sft", "tiny", need=need)


def job(request_id: str, host: str, eta_s: float) -> FleetJob:
    return FleetJob(request_id, "batch", "a", NOW, "sft", "tiny", eta_s=eta_s, host=host)


def durations(seconds: float = 100.0) -> Durations:
    known = Durations()
    known.add("sft", "tiny", seconds)
    return known


def test_an_h100_only_request_waits_for_the_h100_slot_even_when_an_l4_one_frees_first() -> None:
    running = [job("on-l4", "l4", 30.0), job("on-h100", "h100", 200.0)]
    order = [waiting("h100-only", H100), waiting("any"), waiting("big", GpuNeed(None, 40.0))]
    assert etas(order, running, 2, durations(), NOW, kinds=FLEET) == {
        "h100-only": 200.0,  # not 30: the L4 that frees then does not serve it
        "any": 30.0,  # takes the L4
        "big": 300.0,  # 40 GiB: only the H100, after h100-only's 100 s
    }
    # Without kinds every slot serves every request: the first in order takes the first slot to free.
    assert etas(order, running, 2, durations(), NOW)["h100-only"] == 30.0


def test_a_request_no_slot_serves_never_starts_and_holds_nothing_up() -> None:
    running = [job("on-l4", "l4", 30.0), job("on-h100", "h100", 200.0)]
    order = [waiting("b200", GpuNeed(("b200-180gb",))), waiting("any")]
    assert etas(order, running, 2, durations(), NOW, kinds=FLEET) == {"b200": None, "any": 30.0}


def test_an_unknown_end_on_one_kind_leaves_the_other_kinds_etas_known() -> None:
    # Nothing has finished yet: the L4's job has no end anyone can say; the H100's says it ends in 50 s.
    running = [FleetJob("on-l4", "batch", "a", NOW, "sft", "tiny", host="l4"), job("on-h100", "h100", 50.0)]
    order = [waiting("any-1"), waiting("h100-only", H100)]
    # any-1 could start on the H100 at 50, or sooner on the L4: not said, nor anything after it on those kinds.
    assert etas(order, running, 2, Durations(), NOW, kinds=FLEET) == {"any-1": None, "h100-only": None}
    order = [waiting("h100-only", H100), waiting("l4-only", GpuNeed(("l4-24gb",)))]
    assert etas(order, running, 2, Durations(), NOW, kinds=FLEET) == {"h100-only": 50.0, "l4-only": None}


def test_a_preemption_for_an_h100_only_request_stops_a_job_on_an_h100() -> None:
    classes = [PriorityClass(name="urgent"), PriorityClass(name="batch", preemptible=True)]
    bounds = Bounds(classes, min_run_s=0.0, max_count=2)
    running = [
        FleetJob("on-l4", "batch", "a", NOW - 10, "sft", "tiny", eta_s=500.0, host="l4", preemptible=True),
        FleetJob("on-h100", "batch", "a", NOW - 20, "sft", "tiny", eta_s=900.0, host="h100", preemptible=True),
    ]
    urgent = FleetRequest("urgent-h100", "urgent", "a", NOW, "sft", "tiny", need=H100)
    after, starts = preempting([urgent], running, 2, bounds, durations(), NOW, kinds=FLEET)
    # The H100's job is stopped, though the L4's started later (the one a request of any kind would stop).
    assert starts == {"urgent-h100": 0.0}
    assert sorted((job.request_id, job.host) for job in after) == [("on-l4", "l4"), ("urgent-h100", "h100")]
    anyone = FleetRequest("any", "urgent", "a", NOW, "sft", "tiny")
    after, _ = preempting([anyone], running, 2, bounds, durations(), NOW, kinds=FLEET)
    assert {job.request_id for job in after} == {"on-h100", "any"}
    [(request, place, eta)] = places([urgent], {}, running, 2, bounds, durations(), NOW, {}, FLEET)
    assert (request.request_id, place, eta) == ("urgent-h100", 1, 0.0)


def test_every_host_folds_the_kinds_the_hosts_say_in_their_accepted_events() -> None:
    view = FleetView(Settings(gpu_kinds={"l4-24gb": 24, "h100-80gb": 80}))
    for host, kind, request_id in (("l4-host", "l4-24gb", "r1"), ("h100-host", "h100-80gb", "r2")):
        accepted = Accepted(request_id=request_id, method="sft", host=host, host_slots=2, gpu_kind=kind, time=at(0))
        view.observe(read(accepted), NOW)
    kinds = slot_kinds(view.host_slots, view.host_kinds, view.settings.gpu_kinds)
    assert kinds is not None and kinds.slots == {"l4-24gb": 2, "h100-80gb": 2}
    assert kinds.order() == ["l4-24gb", "h100-80gb"]  # a request that takes any kind takes the smaller first
    # A fleet whose hosts say no kind is one kind, as it always was.
    assert slot_kinds({"a": 2}, {"a": None}, {}) is None


@pytest.fixture
def l4_host(tmp_path: Path) -> Settings:
    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    return Settings(
        gpus=["0"],
        gpu_kind="l4-24gb",
        gpu_kinds={"l4-24gb": 24, "h100-80gb": 80},
        warm_child=False,
        work_dir=tmp_path / "work",
        priority_classes=CLASSES,
        default_priority_class="default",
        claims_topic=CLAIMS.topic,
        event_signing_key_file=key,
    )


def record(offset: int, request_id: str, **resources: Any) -> FakeRecord:
    body = sft_request(request_id, priority_class="batch", **({"resources": resources} if resources else {}))
    return FakeRecord(TP.topic, 0, offset, request_id.encode(), json.dumps(body).encode(), timestamp=1_765_000_000_000)


async def test_a_host_claims_only_what_its_gpus_serve_and_the_rest_holds_up_none_behind_it(l4_host: Settings) -> None:
    records = [record(0, "wants-h100", gpu_kind="h100-80gb"), record(1, "wants-80gib", min_gpu_memory_gib=80)]
    dispatcher, mover, core, _ = dispatcher_over(l4_host, [*records, record(2, "any-kind")])
    await turns(dispatcher, lambda: bool(mover.claims()))
    for _ in range(5):
        await dispatcher.turn()
    assert [key for key, _ in mover.claims()] == ["any-kind"]  # the two ahead of it are left for an H100
    assert not core.dead_letters() and not [e for e in core.events() if e["type"] == "rejected"]
    claimed = record(2, "any-kind")
    assert dispatcher.jobs.accepted_fields(CLAIMS, claimed, core.request(claimed))["gpu_kind"] == "l4-24gb"
    # The claim's transaction wrote them again at the end of their partition, keeping their arrival: still waiting.
    [claiming] = [move for move in mover.moves if any(w.topic == CLAIMS.topic for w in move.writes)]
    assert [(w.topic, w.key) for w in claiming.writes if w.topic == TP.topic] == [
        (TP.topic, b"wants-h100"),
        (TP.topic, b"wants-80gib"),
    ]


async def test_a_request_no_declared_kind_serves_is_rejected_where_it_waits(l4_host: Settings) -> None:
    dispatcher, mover, core, _ = dispatcher_over(l4_host, [record(0, "wants-b200", gpu_kind="b200-180gb")])
    await turns(dispatcher, lambda: bool(core.dead_letters()))
    [event] = [e for e in core.events("wants-b200") if e["type"] == "rejected"]
    assert event["reason"] == "resources"
    assert [error["path"] for error in event["errors"]] == ["resources.gpu_kind"]  # type: ignore[union-attr,index]
    assert not mover.claims()


def h100_host_said(view: FleetView, slots: int) -> None:
    """A host of H100s accepted a job (it runs it) and said it has `slots` slots."""
    said = Accepted(
        request_id="on-h100",
        method="sft",
        host="h100-host",
        host_slots=slots,
        gpu_kind="h100-80gb",
        time=datetime.now(UTC),
    )
    view.observe(read(said), time.time())


@pytest.mark.parametrize("h100_free", [True, False])
async def test_a_host_holding_only_requests_it_cannot_serve_leaves_their_queue_while_a_host_that_can_has_room(
    l4_host: Settings, h100_free: bool
) -> None:
    dispatcher, mover, _, batch = dispatcher_over(l4_host, [record(0, "wants-h100", gpu_kind="h100-80gb")])
    h100_host_said(dispatcher.view, 2 if h100_free else 1)  # its one job leaves one slot free, or none
    for _ in range(6):
        await dispatcher.turn()
    assert not mover.claims()
    batch_queue = next(queue for queue in dispatcher.queues if queue.name == "batch")
    if not h100_free:  # nobody could start it sooner: the host keeps the partition and waits with it
        assert batch.leaves == 0 and batch_queue.subscribed
        return
    # It left the queue (the rebalance gives its partitions to the hosts that stay) and stays out a while...
    assert batch.leaves == 1 and not batch_queue.subscribed
    assert dispatcher.away.until["batch"] > time.time()
    # ...then joins again.
    dispatcher.away.until["batch"] = 0.0
    await dispatcher.turn()
    assert batch_queue.subscribed and batch.joins == 2
    # The other classes' queues, holding nothing, were never left.
    assert all(queue.subscribed for queue in dispatcher.queues)


async def test_a_host_that_serves_one_of_its_requests_stays(l4_host: Settings) -> None:
    records = [record(0, "wants-h100", gpu_kind="h100-80gb"), record(1, "not-yet", gpu_kind="l4-24gb")]
    dispatcher, mover, _, batch = dispatcher_over(l4_host, records)
    h100_host_said(dispatcher.view, 2)
    await turns(dispatcher, lambda: bool(mover.claims()))
    assert [key for key, _ in mover.claims()] == ["not-yet"] and batch.leaves <= 1  # left only once full
