"""benchmarks/fleet_metrics.py: each figure of the FLEET line on constructed event lists, where the right
answer can be worked out by hand."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from benchmarks.fleet_metrics import (
    duplicate_commits,
    duplicate_trainings,
    eta_median_error,
    figures,
    fleet_line,
    greedy_makespan,
    greedy_schedule,
    idle_share,
    lost,
    makespan_ratio,
    parse_fleet_line,
    preemptions,
    start_p95,
    steps_retrained_per_preemption,
)
from benchmarks.fleet_shares import fair_share_error, order_share_error, water_fill
from benchmarks.fleet_timeline import Arrival, Seen, holding, seen
from benchmarks.fleet_waits import eta_error_current_median, told_errors, unneeded_preemptions
from schemas import Preempted, Progress, Queued, Started
from tests.helpers import local_success

CLASSES = ["urgent", "default", "batch"]
TWO_HOSTS = {"a": 1, "b": 1}


def batch(request_id: str, at: float = 0.0, team: str = "sweep") -> Arrival:
    return Arrival(request_id, at, "batch", team)


def urgent(request_id: str, at: float, team: str = "oncall") -> Arrival:
    return Arrival(request_id, at, "urgent", team)


def job(request_id: str, host: str, start: float, end: float, steps: int = 2, outcome: str = "succeeded") -> list[Seen]:
    """A job's events on `host`: accepted and started at `start`, a progress per step, its outcome at `end`."""
    events = [Seen("accepted", request_id, start, host), Seen("started", request_id, start, host)]
    events += [
        Seen("progress", request_id, start + (end - start) * step / (steps + 1), host, step=step, total_steps=steps)
        for step in range(1, steps + 1)
    ]
    return [*events, Seen(outcome, request_id, end, host)]


def backlog_beside_an_idle_host() -> tuple[list[Arrival], list[Seen]]:
    # r1 and r2 wait on host a's partition, one after the other; host b runs r3 and then idles from 5 to 10
    # while r2 still waits behind r1.
    arrivals = [batch("r1"), batch("r2"), batch("r3")]
    events = job("r1", "a", 0, 10) + job("r2", "a", 10, 20) + job("r3", "b", 0, 5)
    return arrivals, events


def test_a_free_slot_beside_a_backlog_elsewhere_is_idle_share() -> None:
    arrivals, events = backlog_beside_an_idle_host()
    # b's slot was free from 5 to 10 while r2 waited: 5 of 2 × 20 slot-seconds.
    assert idle_share(arrivals, events, TWO_HOSTS, end=20) == pytest.approx(5 / 40)


def test_a_free_slot_with_nothing_waiting_is_not_idle_share() -> None:
    arrivals = [batch("r1"), batch("r2"), batch("r3")]
    # The same jobs, work-conserving: b takes r2 as soon as r3 is done; after that nothing waits.
    events = job("r1", "a", 0, 10) + job("r3", "b", 0, 5) + job("r2", "b", 5, 15)
    assert idle_share(arrivals, events, TWO_HOSTS, end=15) == 0.0


def test_a_slot_is_free_while_its_last_job_pushes() -> None:
    # r1's child exits at 8 and its adapter is pushed until 10; r2, waiting behind it, is accepted at 8.5.
    arrivals = [batch("r1"), batch("r2")]
    events = job("r1", "a", 0, 10) + job("r2", "a", 8.5, 20)
    pushed = [replace(e, push_s=2.0) if e.type == "succeeded" and e.request_id == "r1" else e for e in events]
    assert idle_share(arrivals, pushed, {"a": 1}, end=20) == pytest.approx(0.5 / 20)
    assert idle_share(arrivals, events, {"a": 1}, end=20) == 0.0  # counted to the event, the slot looks busy
    # A request being pushed wants no slot: nothing waits beside the free slot then.
    alone = [replace(e, push_s=2.0) if e.type == "succeeded" else e for e in job("r1", "a", 0, 10)]
    assert idle_share(arrivals[:1], alone, {"a": 1}, end=10) == 0.0


def test_a_slot_is_held_from_accepted_to_the_release_on_its_host() -> None:
    events = job("r1", "a", 0, 10)[:3]  # accepted, started, a progress: still running
    assert holding(events) == 1
    assert holding([*events, Seen("preempted", "r1", 11, "a", step=1)]) == 0
    assert holding([*events, Seen("succeeded", "r1", 11, "b")]) == 1  # another host's event does not free a's slot


def test_the_makespan_is_judged_against_a_greedy_schedule_of_the_same_durations() -> None:
    arrivals, events = backlog_beside_an_idle_host()
    # Greedy on two slots in arrival order: r1 and r2 at 0 (10 s each), r3 at 10 (5 s): 15 s.
    assert greedy_makespan(arrivals, {"r1": 10, "r2": 10, "r3": 5}, 2, CLASSES) == 15
    assert makespan_ratio(arrivals, events, TWO_HOSTS, CLASSES, end=20) == pytest.approx(20 / 15)


def test_the_greedy_schedule_takes_a_higher_class_first_and_waits_for_arrivals() -> None:
    arrivals = [batch("b1", 0), batch("b2", 0), urgent("u1", 1), batch("late", 50)]
    starts = greedy_schedule(arrivals, {"b1": 10, "b2": 10, "u1": 1, "late": 1}, 1, CLASSES)
    # u1 arrived after b2 but is of a higher class: it goes when b1 ends; `late` starts when it arrives.
    assert starts == {"b1": 0, "u1": 10, "b2": 11, "late": 50}


def test_urgent_start_is_arrival_to_the_first_step_at_the_95th_percentile() -> None:
    arrivals = [urgent(f"u{n}", at=100) for n in range(3)] + [batch("b", 0)]
    events = job("u0", "a", 101, 110, steps=3) + job("u1", "b", 104, 110, steps=3) + job("b", "a", 0, 100)
    events.append(Seen("started", "u2", 130, "a"))  # no step yet: its start counts
    first_steps = {"u0": 101 + 9 / 4, "u1": 104 + 6 / 4, "u2": 130}
    assert start_p95(arrivals, events, "urgent") == pytest.approx(max(first_steps.values()) - 100)
    assert start_p95(arrivals, events[:-1], "urgent") == pytest.approx(first_steps["u1"] - 100)
    assert start_p95([batch("b", 0)], events, "urgent") is None


def test_fair_share_follows_the_weights_under_contention() -> None:
    # Two teams of one class, equal weights, two slots: team x held both slots for the first 10 s while y waited.
    arrivals = [batch("x1", team="x"), batch("x2", team="x"), batch("y1", team="y"), batch("y2", team="y")]
    events = job("x1", "a", 0, 10) + job("x2", "b", 0, 10) + job("y1", "a", 10, 20) + job("y2", "b", 10, 20)
    # Contended while someone waits: 0 to 10, where x had all of the slot-time and a fair share is half.
    assert fair_share_error(arrivals, events, {}, end=20) == pytest.approx(0.5)
    interleaved = job("x1", "a", 0, 10) + job("y1", "b", 0, 10) + job("x2", "a", 10, 20) + job("y2", "b", 10, 20)
    assert fair_share_error(arrivals, interleaved, {}, end=20) == pytest.approx(0.0)
    # With x weighted 3 to 1, x's share is 3/4 of the contended window; one slot each is then a gap of 1/4.
    assert fair_share_error(arrivals, interleaved, {"x": 3.0, "y": 1.0}, end=20) == pytest.approx(0.25)


def test_a_share_left_idle_is_lent_and_a_higher_class_comes_first() -> None:
    # y wants one slot only: x may use the other (lent), and that is no error.
    arrivals = [batch("x1", team="x"), batch("x2", team="x"), batch("x3", team="x"), batch("y1", team="y")]
    events = job("x1", "a", 0, 10) + job("y1", "b", 0, 10) + job("x2", "a", 10, 20) + job("x3", "b", 10, 20)
    assert fair_share_error(arrivals, events, {"x": 1.0, "y": 3.0}, end=20) == pytest.approx(0.0)
    assert order_share_error(arrivals, events, TWO_HOSTS, CLASSES, {"x": 1.0, "y": 3.0}, end=20) == pytest.approx(0.0)
    assert water_fill(2, {"x": 3, "y": 1}, {"x": 1.0, "y": 3.0}) == {"x": 1.0, "y": 1.0}
    # An urgent request waiting from 2 to 10 behind two batch jobs: in the fleet's order it had a slot from 2 on.
    arrivals = [batch("b1"), batch("b2"), urgent("u1", 2)]
    events = job("b1", "a", 0, 10) + job("b2", "b", 0, 10) + job("u1", "a", 10, 12)
    # Contended 2 to 10: the sweep had all 16 slot-seconds, its due was 8 of them (oncall's the other 8)...
    assert order_share_error(arrivals, events, TWO_HOSTS, CLASSES, {}, end=12) == pytest.approx(0.5)
    # ...but that is the classes' order: within each class only one team wanted slots, so no fair share was at stake.
    assert fair_share_error(arrivals, events, {}, end=12) is None


def test_fair_share_is_judged_within_each_class_on_the_slots_the_class_held() -> None:
    # x and y of batch share the one slot batch keeps while u1 (urgent) holds the other from 0 to 20; y had it
    # all the while x waited too: a gap of 1/2 in batch. Urgent's own slot is no part of batch's fair share.
    arrivals = [urgent("u1", 0), batch("x1", team="x"), batch("y1", team="y"), batch("y2", team="y")]
    events = job("u1", "a", 0, 20) + job("y1", "b", 0, 10) + job("y2", "b", 10, 20) + job("x1", "b", 20, 30)
    assert fair_share_error(arrivals, events, {}, end=30) == pytest.approx(0.5)
    fair = job("u1", "a", 0, 20) + job("y1", "b", 0, 10) + job("x1", "b", 10, 20) + job("y2", "b", 20, 30)
    assert fair_share_error(arrivals, fair, {}, end=30) == pytest.approx(0.0)


def test_a_team_at_its_cap_wants_no_more_slots_and_its_share_is_lent() -> None:
    # evals (weight 2) capped at one slot of two, sweep (weight 1): one slot each is the fair split, not 2:1.
    arrivals = [batch("s1"), batch("s2"), batch("e1", team="evals"), batch("e2", team="evals")]
    events = job("e1", "a", 0, 10) + job("s1", "b", 0, 10) + job("e2", "a", 10, 20) + job("s2", "b", 10, 20)
    weights = {"sweep": 1.0, "evals": 2.0}
    assert fair_share_error(arrivals, events, weights, end=20, caps={"evals": 1}) == pytest.approx(0.0)
    assert fair_share_error(arrivals, events, weights, end=20) == pytest.approx(2 / 3 - 1 / 2)


def test_no_contention_between_teams_gives_no_fair_share_error() -> None:
    arrivals, events = backlog_beside_an_idle_host()  # one team only
    assert fair_share_error(arrivals, events, {}, end=20) is None


def test_the_eta_error_is_the_median_relative_error_of_the_first_queued_eta() -> None:
    events = [
        Seen("queued", "r1", 0, "a", eta_s=10),
        Seen("started", "r1", 10, "a"),  # exact
        Seen("queued", "r2", 0, "a", eta_s=10),
        Seen("started", "r2", 20, "a"),  # half the wait: 0.5
        Seen("queued", "r3", 0, "a", eta_s=30),
        Seen("queued", "r3", 5, "a", eta_s=1),
        Seen("started", "r3", 10, "a"),  # first: 2.0
        Seen("queued", "r4", 0, "a", eta_s=None),
        Seen("started", "r4", 10, "a"),  # no ETA given: not judged
    ]
    assert eta_median_error(events) == pytest.approx(0.5)
    # A wait under the 1 s floor: the error is the seconds off over 1 s (an ETA of 0 for a start
    # 0.1 s later is right to 0.1 s).
    assert eta_median_error([Seen("queued", "r1", 0, "a", eta_s=3), Seen("started", "r1", 0.1, "a")]) == pytest.approx(
        2.9
    )
    assert eta_median_error([Seen("queued", "r1", 0, "a", eta_s=0), Seen("started", "r1", 0.1, "a")]) == pytest.approx(
        0.1
    )
    assert eta_median_error(job("r1", "a", 0, 1)) is None


def test_preemptions_and_the_steps_trained_again_after_each() -> None:
    events = [
        *job("b1", "a", 0, 5, steps=5)[:-1],
        Seen("preempted", "b1", 5, "a", step=5),
        Seen("accepted", "b1", 9, "b"),
        Seen("started", "b1", 9, "b", resumed_step=4),  # one step again
        Seen("preempted", "b2", 6, "b", step=None),
        Seen("started", "b2", 12, "a"),  # from scratch after 0 steps
    ]
    assert preemptions(events) == 2
    assert steps_retrained_per_preemption(events) == pytest.approx(0.5)
    # b2 had reached step 3 before it was preempted (its progress says so): all three trained again.
    events.insert(0, Seen("progress", "b2", 5.5, "b", step=3, total_steps=9))
    assert steps_retrained_per_preemption(events) == pytest.approx((1 + 3) / 2)
    assert steps_retrained_per_preemption(job("b1", "a", 0, 5)) is None


def test_a_preemption_is_unneeded_when_a_slot_went_to_a_lower_class_while_its_request_waited() -> None:
    # u1 arrives at 10; at 12 host b's slot frees and goes to batch b3; at 15 u1 preempts b1 on host a.
    arrivals = [batch("b1"), batch("b2"), batch("b3"), urgent("u1", 10)]
    events = [
        *job("b1", "a", 0, 15)[:-1],
        Seen("preempted", "b1", 15, "a", by="u1"),
        *job("b2", "b", 0, 12),
        *job("b3", "b", 12, 30),
        *job("u1", "a", 16, 20),
    ]
    assert unneeded_preemptions(arrivals, events, CLASSES) == 1
    # Had b3 been given the slot before u1 arrived, or u1 taken b's free slot, the preemption was
    # the only way, or none happened.
    before = [replace(e, at=e.at - 3) if e.request_id == "b3" and e.type == "accepted" else e for e in events]
    assert unneeded_preemptions(arrivals, before, CLASSES) == 0
    # A slot going to a request of u1's own class or higher is no inversion; a preemption whose
    # taker is unknown is not judged.
    assert unneeded_preemptions([*arrivals[:2], urgent("b3", 0), arrivals[3]], events, CLASSES) == 0
    assert unneeded_preemptions(arrivals, [replace(e, by=None) for e in events], CLASSES) == 0
    assert figures(arrivals, events, TWO_HOSTS, CLASSES, {}, {})["unneeded_preemptions"] == 1


def test_the_current_eta_error_weighs_each_told_eta_by_how_long_it_was_the_last_told() -> None:
    # r1 waits 0 to 40: told 10 s at 2 (error |10 - 38| / 38), then 30 s at 10 (exact) for 30 of
    # the 38 s it was told anything.
    arrivals = [batch("r1")]
    events = [
        Seen("queued", "r1", 2, "a", eta_s=10),
        Seen("queued", "r1", 10, "a", eta_s=30),
        Seen("started", "r1", 40, "a"),
    ]
    assert told_errors(arrivals, events) == [(pytest.approx(28 / 38), 8), (0.0, 30)]
    assert eta_error_current_median(arrivals, events) == 0.0  # the exact one held most of the time
    # Revised too late: the stale one held 30 of the 38 s, and it is the median.
    late = [
        Seen("queued", "r1", 2, "a", eta_s=10),
        Seen("queued", "r1", 32, "a", eta_s=8),
        Seen("started", "r1", 40, "a"),
    ]
    assert eta_error_current_median(arrivals, late) == pytest.approx(28 / 38)
    # A request preempted waits again: its ETAs after the preemption are judged against its next start, not its first.
    again = [
        *events,
        Seen("preempted", "r1", 50, "a"),
        Seen("queued", "r1", 51, "a", eta_s=4),
        Seen("started", "r1", 60, "a"),
    ]
    assert told_errors(arrivals, again)[-1] == (pytest.approx(5 / 9), 9)
    # Told no ETA, or never started (cancelled while waiting): nothing to judge.
    assert eta_error_current_median(arrivals, [Seen("queued", "r1", 2, "a"), Seen("started", "r1", 40, "a")]) is None
    assert eta_error_current_median(arrivals, events[:2]) is None


def test_a_request_without_a_terminal_event_is_lost() -> None:
    arrivals = [batch("r1"), batch("r2"), batch("r3")]
    events = job("r1", "a", 0, 5) + job("r2", "b", 0, 5)[:-1]  # r2 ran and never ended; r3 never ran
    assert lost(arrivals, events) == 2
    assert lost(arrivals[:1], events) == 0


def test_a_run_in_which_nothing_ran_is_all_idle_and_all_lost() -> None:
    # What a fleet whose daemons read none of the topics the requests went to shows at the run's end (60 s).
    result = figures([batch("r1"), urgent("u1", 10)], [], TWO_HOSTS, CLASSES, {}, {}, end=60)
    # Two free slots: one idle beside r1 from 0 to 10, both from u1's arrival on: 110 of 120 slot-seconds.
    assert result["idle_share"] == pytest.approx(110 / 120) and result["lost"] == 2
    assert result["makespan_ratio"] is None and result["urgent_start_p95_s"] is None


def test_two_trainings_of_a_request_at_once_are_a_duplicate_training() -> None:
    # Host b started r1 while a was still training it (a's progress after b's start).
    events = job("r1", "a", 0, 10, steps=4) + [
        Seen("started", "r1", 3, "b"),
        Seen("progress", "r1", 4, "b", step=1, total_steps=4),
    ]
    assert duplicate_trainings(events) == 1


def test_a_request_trained_to_its_last_step_twice_is_a_duplicate_training() -> None:
    events = job("r1", "a", 0, 10, steps=2, outcome="failed") + job("r1", "b", 20, 30, steps=2)
    assert duplicate_trainings(events) == 1


def test_a_resume_after_a_preemption_is_not_a_duplicate_training() -> None:
    events = [*job("r1", "a", 0, 10, steps=4)[:3], Seen("preempted", "r1", 4, "a", step=1)]
    events += [
        Seen("accepted", "r1", 6, "b"),
        Seen("started", "r1", 6, "b", resumed_step=1),
        Seen("progress", "r1", 7, "b", step=4, total_steps=4),
        Seen("succeeded", "r1", 8, "b"),
    ]
    assert duplicate_trainings(events) == 0
    assert duplicate_trainings(job("r1", "a", 0, 10) + job("r2", "a", 10, 20)) == 0


def test_a_preempted_job_accepted_again_by_its_first_host_after_running_elsewhere_is_not_a_duplicate_training() -> None:
    # Seen in a run: b1 preempted on a at 5, resumed on b at 6, preempted there at 9 and accepted by a again at 10;
    # a's `accepted` at 10 is not a's first training still going on beside b's.
    events = [
        *job("b1", "a", 0, 5, steps=4)[:3],
        Seen("preempted", "b1", 5, "a"),
        *job("b1", "b", 6, 9, steps=4)[:3],
        Seen("preempted", "b1", 9, "b"),
        *job("b1", "a", 10, 20),
    ]
    assert duplicate_trainings(events) == 0
    # Without the preemption on a (its child still training there), b's start at 6 would be a second training at once.
    assert duplicate_trainings([e for e in events if not (e.type == "preempted" and e.host == "a")]) == 1


def test_more_than_one_commit_of_a_request_is_a_duplicate_commit() -> None:
    assert duplicate_commits({"r1": 1, "r2": 2, "r3": 0, "r4": 3}) == 2


def test_events_are_read_from_the_daemons_own_events() -> None:
    at = datetime(2026, 12, 5, 12, 0, tzinfo=UTC)
    progress = seen(Progress(request_id="r1", host="a", time=at, step=3, total_steps=9))
    assert progress == Seen("progress", "r1", at.timestamp(), "a", step=3, total_steps=9, stage="train")
    started = seen(Started(request_id="r1", host="b", time=at, method="sft", slot="cpu", pid=1, resumed_step=2))
    assert started is not None and started.resumed_step == 2
    queued = seen(Queued(request_id="r1", host="b", time=at, priority_class="batch", team="t", place=3, eta_s=12.5))
    assert queued is not None and queued.eta_s == 12.5
    preempted = seen(
        Preempted(request_id="r1", host="b", time=at, by="u1", priority_class="batch", preemptions=1, step=4)
    )
    assert preempted is not None and preempted.step == 4
    succeeded = seen(
        local_success(
            "r1",
            host="b",
            time=at,
            durations_s={"push": 0.25, "total": 9.0},
            base_model="tiny",
        )
    )
    assert succeeded is not None and succeeded.push_s == 0.25 and not succeeded.duplicate


def test_the_fleet_line_holds_every_figure_and_parses_back() -> None:
    arrivals, events = backlog_beside_an_idle_host()
    result = figures(arrivals, events, TWO_HOSTS, CLASSES, {}, {"r1": 1, "r2": 1, "r3": 1})
    line = fleet_line(result)
    assert line.startswith("FLEET urgent_start_p95_s=n/a idle_share=0.125 ")
    parsed = parse_fleet_line(line)
    assert parsed == {
        "urgent_start_p95_s": "n/a",
        "idle_share": "0.125",
        "makespan_ratio": "1.333",
        "fair_share_error": "n/a",
        "order_share_error": "n/a",
        "eta_median_error": "n/a",
        "eta_error_current_median": "n/a",
        "preemptions": "0",
        "unneeded_preemptions": "0",
        "steps_retrained_per_preemption": "n/a",
        "lost": "0",
        "duplicate_trainings": "0",
        "duplicate_commits": "0",
    }
    with pytest.raises(ValueError, match="not a FLEET line"):
        parse_fleet_line("SOAK lost=0")
