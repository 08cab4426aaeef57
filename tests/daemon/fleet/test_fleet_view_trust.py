"""The fleet's view folds only verified events, each `event_id` once (issue 61): a forged unsigned event, or
a genuine one written again, moves none of the teams' usage, caps, the hosts' slots or the running jobs.
In process: records handed to `FleetView.take` as the events topic's reader yields them and a worker thread checks
them (daemon/kafka/event_reader.py `checked`)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from daemon.fleet.policy.order import FleetRequest
from daemon.fleet.view import USAGE_LOOKBACK_S, FleetView
from daemon.kafka.event_ids import EventIds
from daemon.kafka.event_reader import checked
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys, event_signer
from schemas import Accepted, Cancelled, Event, Started
from schemas.signing import SIGNATURE_HEADER, EventSigner
from testbed.fleet_keys import fleet_keys
from testbed.memory_kafka import FakeRecord

CLASSES = [{"name": "urgent"}, {"name": "batch", "preemptible": True}]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        work_dir=tmp_path, priority_classes=CLASSES, teams={"vision": {"max_slots": 1}}, **fleet_keys(tmp_path / "keys")
    )


def at(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(time.time() - seconds_ago, UTC)


def record(settings: Settings, event: Event, signer: EventSigner | None) -> FakeRecord:
    value = event.model_dump_json().encode()
    headers: list[tuple[str, bytes | None]] = [(SIGNATURE_HEADER, signer.sign(value))] if signer is not None else []
    return FakeRecord(settings.events_topic, 0, 0, (event.request_id or "").encode(), value, headers)


def fold(settings: Settings, records: list[FakeRecord]) -> FleetView:
    view, keys, now = FleetView(settings), event_keys(settings), time.time()
    for each in records:
        view.take(each, checked(each, keys), now)
    return view


VISION = FleetRequest(
    "v-next", "batch", "vision", time.time(), "sft", "tiny"
)  # vision's next request, behind its cap of 1 slot


async def test_a_forged_unsigned_event_changes_nothing_when_the_fleet_has_keys(settings: Settings) -> None:
    signer = event_signer(settings)
    forged = [
        Accepted(
            request_id="f-1",
            method="sft",
            host="ghost",
            host_slots=1000,
            priority_class="batch",
            team="vision",
            time=at(60),
        ),
        Started(request_id="f-1", method="sft", pid=1, slot="0,1,2,3", host="ghost", time=at(60)),
    ]
    with capture_logs() as logs:
        view = fold(settings, [record(settings, event, None) for event in forged])
    assert [(entry["event"], entry["reason"]) for entry in logs] == [
        ("fleet.event_skipped", "unsigned")
    ]  # the first of each reason
    assert view.host_slots == {} and view.usage.running() == {} and view.usage.slot_seconds(time.time()) == {}
    assert view.running_jobs.jobs(time.time()) == [] and view.skipped == {"unsigned": 2}
    assert view.pick([VISION], free=1) == VISION  # vision is not at its cap: its request is picked
    # The same events signed by the fleet's key are folded: what the forged ones would have done.
    signed = fold(settings, [record(settings, event, signer) for event in forged])
    assert (
        signed.host_slots == {"ghost": 1000}
        and signed.usage.running() == {"vision": 4}
        and signed.pick([VISION], free=1) is None
    )


async def test_a_genuine_event_written_twice_counts_once(settings: Settings) -> None:
    signer = event_signer(settings)
    accepted = Accepted(
        request_id="r-1", method="sft", host="gpu-a", host_slots=4, priority_class="batch", team="vision", time=at(600)
    )
    started = Started(request_id="r-1", method="sft", pid=1, slot="0,1", host="gpu-a", time=at(590))
    once = fold(settings, [record(settings, event, signer) for event in (accepted, started)])
    twice = fold(settings, [record(settings, event, signer) for event in (accepted, started, accepted, started)])
    now = time.time()
    assert twice.usage.running() == once.usage.running() == {"vision": 2}
    assert twice.usage.slot_seconds(now)["vision"] == pytest.approx(once.usage.slot_seconds(now)["vision"])
    assert (
        [job.gpus for job in twice.running_jobs.jobs(now)] == [job.gpus for job in once.running_jobs.jobs(now)] == [2]
    )
    assert twice.host_slots == once.host_slots == {"gpu-a": 4}
    assert twice.skipped == {"repeated": 2}


async def test_a_finished_jobs_accepted_written_again_leaves_its_team_free_with_its_usage(settings: Settings) -> None:
    """The probe's case: a genuine `accepted` of a job that held one slot for 1,000 s and ended, written again
    verbatim, made its team look as if it held a slot for 80 minutes (1,000 slot-seconds became about 4,554)
    and, at its cap of 1, its next request was never picked."""
    signer = event_signer(settings)
    ran = [
        Accepted(request_id="r-1", method="sft", host="gpu-a", priority_class="batch", team="vision", time=at(4800)),
        Cancelled(request_id="r-1", reason="done", host="gpu-a", time=at(3800)),
    ]
    genuine = [record(settings, event, signer) for event in ran]
    before = fold(settings, genuine)
    after = fold(settings, [*genuine, genuine[0]])
    now = time.time()
    used = before.usage.slot_seconds(now)["vision"]
    assert (
        1000 * 0.4 < used < 1000 * 0.5
    )  # 1,000 slot-seconds, decayed by the 63 to 80 minutes since (half-life an hour)
    assert after.usage.slot_seconds(now)["vision"] == pytest.approx(used)  # not 4,554 decayed: the replay adds nothing
    assert after.usage.running() == {} and after.running_jobs.jobs(now) == []
    assert after.pick([VISION], free=1) == VISION
    assert after.skipped == {"repeated": 1}


async def test_a_genuine_event_older_than_the_window_is_not_folded(settings: Settings) -> None:
    """Its id may be forgotten (the memory holds the window's ids only), so it is refused by its age: an old
    `accepted` taken again would open a stretch hours long."""
    signer = event_signer(settings)
    old = Accepted(
        request_id="r-old",
        method="sft",
        host="gpu-a",
        team="vision",
        priority_class="batch",
        time=at(USAGE_LOOKBACK_S + 60),
    )
    view = fold(settings, [record(settings, old, signer)])
    assert view.usage.running() == {} and view.skipped == {"stale": 1}


def test_the_memory_of_ids_holds_the_windows_ids_only() -> None:
    ids, now = EventIds(window_s=100.0), time.time()
    events = [
        Cancelled(request_id=f"r-{n}", reason="x", time=datetime.fromtimestamp(now - 145 + n * 10, UTC))
        for n in range(15)
    ]
    refused = [ids.refused(event, now) for event in events]
    assert refused == ["stale"] * 5 + [None] * 10 and len(ids) == 10
    assert ids.refused(events[7], now) == "repeated"
    assert (
        ids.refused(events[9], now + 60) == "stale" and len(ids) == 4
    )  # the window moved on: its ids forgotten with it
