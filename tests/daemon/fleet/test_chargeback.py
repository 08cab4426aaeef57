"""`adapterd usage`'s fold (daemon/fleet/policy/chargeback.py) on constructed events: GPU-hours, jobs and runs per team
and class in a period, a run cut at the period's edges, one still running counted up to now, a preempted request resumed
counted as two runs, a daemon stop's run ended where its request is accepted again, CPU jobs as jobs of no GPU-hours."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from daemon.fleet.policy.chargeback import UNKNOWN_TEAM, Row, gpus_of, report, runs_of
from schemas import Event, parse_event
from tests.helpers import event_document

START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 12, 1, tzinfo=UTC)
NOW = datetime(2026, 12, 7, tzinfo=UTC).timestamp()


def at(hours: float) -> datetime:
    """`hours` after the period's start (before it when negative)."""
    return START + timedelta(hours=hours)


def event(kind: str, request_id: str, hours: float, **fields: Any) -> Event:
    document = event_document(kind, request_id=request_id, time=at(hours).isoformat(), **fields)
    return parse_event(json.dumps(document).encode())


def accepted(request_id: str, hours: float, team: str | None, priority_class: str | None = "batch") -> Event:
    return event("accepted", request_id, hours, team=team, priority_class=priority_class)


def started(request_id: str, hours: float, slot: str, **fields: Any) -> Event:
    return event("started", request_id, hours, slot=slot, **fields)


def ended(kind: str, request_id: str, hours: float, **fields: Any) -> Event:
    return event(kind, request_id, hours, **fields)


EVENTS = [
    # Inside the period: 2 GPUs for 3 hours.
    accepted("inside", 10, "search", "batch"),
    started("inside", 10, "0,1"),
    ended("succeeded", "inside", 13),
    # Straddling the start: 1 GPU from 5 hours before it to 4 hours after; 4 hours count.
    accepted("straddle", -5, "search", "batch"),
    started("straddle", -5, "3"),
    ended("failed", "straddle", 4),
    # Preempted after 2 hours on 4 GPUs, resumed later on 2 for 1 hour: two runs, one job, 10 GPU-hours.
    accepted("sweep", 100, "ads", "urgent"),
    started("sweep", 100, "0,1,2,3"),
    ended("preempted", "sweep", 102, by="other", priority_class="urgent", preemptions=1),
    accepted("sweep", 110, "ads", "urgent"),
    started("sweep", 110, "4,5"),
    ended("succeeded", "sweep", 111),
    # A CPU job: a job and a run, no GPU-hours.
    accepted("cpu-job", 20, "ads", "urgent"),
    started("cpu-job", 20, "cpu"),
    ended("succeeded", "cpu-job", 25),
    # Ended before the period: not counted at all.
    accepted("old", -30, "search", "batch"),
    started("old", -30, "0"),
    ended("cancelled", "old", -20, reason="operator"),
    # Still running past the period's end (on 1 GPU since 2 hours before it): 2 hours count.
    accepted("long", 30 * 24 - 2, None, None),
    started("long", 30 * 24 - 2, "7"),
]


def test_gpus_are_those_the_slot_names_or_a_ray_jobs_own() -> None:
    slots = ("cpu", "0", "0,1", "2,3,4,5")
    assert [gpus_of(started("x", 0, slot)) for slot in slots] == [0, 1, 2, 4]  # type: ignore[arg-type]
    # A job run on the Ray cluster takes none of its host's slots: its GPUs are its ranks, counted like any other's.
    assert gpus_of(started("x", 0, "ray", gpus=16, child="ray job adapterd-x-a1")) == 16  # type: ignore[arg-type]


def test_gpu_hours_jobs_and_runs_per_team_and_class() -> None:
    assert report(EVENTS, START, END, NOW) == [
        Row("ads", "urgent", 4 * 2 + 2 * 1, jobs=2, runs=3),  # the sweep's two runs and the CPU job's one
        Row("default", None, 2.0, jobs=1, runs=1),  # a host with no classes: the default team, no class
        Row("search", "batch", 2 * 3 + 4, jobs=2, runs=2),  # "old" ended before the period
    ]


def test_grouped_by_team_or_by_class() -> None:
    more = [
        accepted("other-class", 50, "search", "urgent"),
        started("other-class", 50, "0"),
        ended("succeeded", "other-class", 51),
    ]
    assert report([*EVENTS, *more], START, END, NOW, by=["team"]) == [
        Row("ads", None, 10.0, jobs=2, runs=3),
        Row("default", None, 2.0, jobs=1, runs=1),
        Row("search", None, 11.0, jobs=3, runs=3),
    ]
    assert report([*EVENTS, *more], START, END, NOW, by=["class"]) == [
        Row(None, None, 2.0, jobs=1, runs=1),
        Row(None, "batch", 10.0, jobs=2, runs=2),
        Row(None, "urgent", 11.0, jobs=3, runs=4),
    ]


def test_a_run_still_going_counts_up_to_now() -> None:
    now = at(50).timestamp()  # the period has not ended yet
    [row] = report([accepted("busy", 45, "search"), started("busy", 46, "0,1")], START, END, now)
    assert row == Row("search", "batch", 2 * 4, jobs=1, runs=1)


def test_a_run_whose_daemon_stopped_ends_where_its_request_is_accepted_again() -> None:
    events = [
        accepted("stopped", 1, "search"),
        started("stopped", 1, "0"),  # its daemon stops at some point: nothing published
        accepted("stopped", 6, "search"),  # taken again elsewhere: the first run ends here
        started("stopped", 7, "1,2"),
        ended("succeeded", "stopped", 8),
    ]
    assert [(run.since, run.until) for run in runs_of(events, NOW)] == [
        (at(1).timestamp(), at(6).timestamp()),
        (at(7).timestamp(), at(8).timestamp()),
    ]
    assert report(events, START, END, NOW) == [Row("search", "batch", 5 + 2, jobs=1, runs=2)]


def test_a_run_straddling_the_end_counts_its_part_inside() -> None:
    events = [
        accepted("late", 30 * 24 - 1, "search"),
        started("late", 30 * 24 - 1, "0,1"),
        ended("succeeded", "late", 30 * 24 + 3),
    ]
    assert report(events, START, END, NOW) == [Row("search", "batch", 2.0, jobs=1, runs=1)]
    assert report(events, END, END + timedelta(days=1), NOW) == [Row("search", "batch", 6.0, jobs=1, runs=1)]


def test_a_run_whose_accepted_event_was_not_read_takes_its_queued_events_team_else_unknown() -> None:
    queued = event("queued", "q", -1, team="search", priority_class="batch", place=1)
    events = [
        queued,
        started("q", 1, "0"),
        ended("succeeded", "q", 2),
        started("lost", 1, "0"),
        ended("succeeded", "lost", 3),
    ]
    assert report(events, START, END, NOW) == [
        Row(UNKNOWN_TEAM, None, 2.0, jobs=1, runs=1),
        Row("search", "batch", 1.0, jobs=1, runs=1),
    ]


def test_an_event_from_a_clock_ahead_adds_no_time_from_the_future() -> None:
    now = at(5).timestamp()
    [row] = report(
        [accepted("ahead", 1, "search"), started("ahead", 1, "0"), ended("succeeded", "ahead", 9)], START, END, now
    )
    assert row.gpu_hours == 4.0


def test_a_grouping_that_is_not_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="by: host is not a grouping"):
        report(EVENTS, START, END, NOW, by=["host"])
