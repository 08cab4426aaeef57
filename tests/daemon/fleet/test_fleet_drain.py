"""A request of several GPUs is not starved by one-GPU requests on a fleet with priority classes (issue 62, item 6):
the host holding it first in its view of the fleet's order drains for it once it has waited `reserve_after_s`, and a
request backfills the drain only when its expected end is before the reservation is due (daemon/fleet/policy/drain.py,
`FleetView.pick`). Decisions on a fake view: a `FleetView` whose clock and durations are the test's."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from daemon.fleet import view as view_module
from daemon.fleet.policy.drain import drain
from daemon.fleet.policy.eta import Bounds, places
from daemon.fleet.policy.order import FleetJob, FleetRequest
from daemon.fleet.view import FleetView
from daemon.settings import Settings
from testbed.fleet_keys import fleet_keys

CLASSES = [{"name": "urgent"}, {"name": "default", "preemptible": True}]
SLOTS = 2
BOUND_S = 30.0


class Clock:
    """The view's `time` module, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now


class FixedDurations:
    """The durations the view reads: each model's expected seconds (None: nothing known), no step's pace."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    def step_s(self, method: str, model: str, running: Sequence[float] = ()) -> float | None:
        return None

    def expected(
        self, method: str, model: str, steps: int | None = None, running: Sequence[float] = ()
    ) -> float | None:
        return self.seconds.get(model)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(view_module, "time", fake)
    return fake


def fleet_view(tmp_path: Path, seconds: dict[str, float] | None = None) -> FleetView:
    settings = Settings(
        work_dir=tmp_path, priority_classes=CLASSES, reserve_after_s=BOUND_S, **fleet_keys(tmp_path / "keys")
    )
    view = FleetView(settings)
    view.durations = FixedDurations(seconds or {})  # type: ignore[assignment]
    return view


def request(request_id: str, arrived: float, gpus: int = 1, model: str = "tiny", cls: str = "default") -> FleetRequest:
    return FleetRequest(request_id, cls, "a", arrived, "sft", model, gpus=gpus)


def job(request_id: str, ends: float, now: float, gpus: int = 1) -> FleetJob:
    return FleetJob(request_id, "default", "a", now, "sft", "tiny", eta_s=ends - now, gpus=gpus, host="here")


def test_a_two_slot_request_behind_a_stream_of_one_slot_requests_starts_within_the_bound(
    tmp_path: Path, clock: Clock
) -> None:
    """A two-slot host, one-slot requests arriving every 10 s and each running 60 s (of a duration nobody knows), a
    two-slot request arriving at t=5. Each time a slot frees, the host picks as its dispatcher does. Before the bound
    the stream takes the slots; after it the host drains, and the two-slot request starts once the jobs running then
    end: by the bound plus one job's length. Without the drain it never started while the stream lasted."""
    view, start = fleet_view(tmp_path), clock.now
    running = {"s0": start + 60, "s1": start + 30}  # request → its end
    arrivals = [request(f"s{n}", start + 10 * n) for n in range(2, 200)]
    big = request("big", start + 5, gpus=2)
    waiting: list[FleetRequest] = [big]
    began: dict[str, float] = {}
    while "big" not in began and clock.now < start + 1000:
        clock.now = min(running.values())  # the next end
        running = {rid: end for rid, end in running.items() if end > clock.now}
        waiting += [
            each
            for each in arrivals
            if each.arrived <= clock.now and each not in waiting and each.request_id not in began
        ]
        while (free := SLOTS - sum(2 if rid == "big" else 1 for rid in running)) > 0:
            here = [job(rid, end, clock.now, gpus=2 if rid == "big" else 1) for rid, end in running.items()]
            chosen = view.pick(waiting, free, {}, here=here, slots=SLOTS)
            if chosen is None:
                break
            waiting.remove(chosen)
            began[chosen.request_id] = clock.now
            running[chosen.request_id] = clock.now + 60
    assert "big" in began, "never started"
    assert began["big"] - big.arrived <= BOUND_S + 60  # the bound, then the longest job running when it passed
    after_bound = [rid for rid, at in began.items() if rid != "big" and big.arrived + BOUND_S <= at < began["big"]]
    assert after_bound == []  # no request of the stream started on the drained host
    assert [rid for rid, at in began.items() if at < big.arrived + BOUND_S] == [
        "s2"
    ]  # within the bound, the stream went on


def test_a_request_backfills_the_drain_only_when_its_expected_end_is_before_the_reservation_is_due(
    tmp_path: Path, clock: Clock
) -> None:
    view = fleet_view(tmp_path, {"short": 40.0, "long": 500.0})
    now = clock.now
    big = request("big", now - BOUND_S - 1, gpus=2)  # first in the order (the earliest), and past the bound
    here = [job("s0", now + 100, now)]  # the reservation is due in 100 s
    short, long, unknown = (
        request("short", now - 5, model="short"),
        request("long", now - 6, model="long"),
        request("u", now - 7),
    )
    assert (
        view.pick([big, long, unknown, short], 1, {}, here=here, slots=SLOTS) == short
    )  # ends in 40 s: before the 100
    assert view.pick([big, long, unknown], 1, {}, here=here, slots=SLOTS) is None  # 500 s; and a duration nobody knows
    # A running job whose end nobody knows: the reservation's due time is unknown, so nothing backfills it.
    unknown_end = [FleetJob("s0", "default", "a", now, "sft", "tiny", host="here")]
    assert view.pick([big, short], 1, {}, here=unknown_end, slots=SLOTS) is None
    # Not yet waited the bound: the free slot goes to the first that fits, as without a reservation.
    assert view.pick(
        [request("big", now - 10, gpus=2), request("long", now - 5, model="long")], 1, {}, here=here, slots=SLOTS
    ) == request("long", now - 5, model="long")


def test_a_higher_class_or_a_request_of_no_more_gpus_than_are_free_is_not_held_back(
    tmp_path: Path, clock: Clock
) -> None:
    """The drain is for the first of the fleet's order among the heads: an urgent one-slot request is ahead of a
    default two-slot one, and takes the free slot; a two-slot request with two free slots simply starts."""
    view = fleet_view(tmp_path)
    now = clock.now
    big, urgent = request("big", now - 100, gpus=2), request("u", now - 1, cls="urgent")
    here = [job("s0", now + 100, now)]
    assert view.pick([big, urgent], 1, {}, here=here, slots=SLOTS) == urgent
    assert view.pick([big, request("s", now - 1)], 2, {}, here=[], slots=SLOTS) == big
    # More GPUs than the host has: never fits here, so it drains nothing (another host, or a rejection, is for it).
    assert drain(request("huge", now - 100, gpus=4), 1, SLOTS, here, view.durations, now, BOUND_S) is None


def test_the_etas_count_the_drain_the_request_of_several_gpus_at_its_slots_end_and_those_behind_it_after(
    tmp_path: Path, clock: Clock
) -> None:
    """The `queued` ETAs (`places`, list scheduling in the fleet's order) tell what the drain does: the two-slot request
    starts when the host's two jobs have ended (100 s), not when the first ends (30 s), and the one-slot request
    behind it, though a slot frees for it at 30 s, after it. (This was the model before the reservation too; it is
    the reservation that makes it what happens.)"""
    now = clock.now
    durations = FixedDurations({"tiny": 60.0})
    running = [job("s0", now + 100, now), job("s1", now + 30, now)]
    big, behind = request("big", now - 40, gpus=2), request("s3", now - 1)
    placed = places([big, behind], {}, running, SLOTS, Bounds([], 120.0, 2), durations, now, {})
    assert [(w.request_id, place, eta) for w, place, eta in placed] == [("big", 1, 100.0), ("s3", 2, 160.0)]
