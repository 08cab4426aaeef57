"""Each team's slot-time, the recent job durations (daemon/fleet/policy/usage.py) and the fleet's running jobs
(daemon/fleet/policy/running.py), folded from the fleet's own events: real schemas events, read back as a host
reads them from the events topic."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from daemon.fleet.policy.order import FleetRequest, Standing, fleet_order
from daemon.fleet.policy.running import Occupancy
from daemon.fleet.policy.usage import Durations, Usage
from daemon.settings.fleet import PriorityClass
from schemas import (
    Accepted,
    Cancelled,
    Checkpoint,
    Event,
    Failed,
    Preempted,
    Progress,
    Queued,
    Retrying,
    Started,
    parse_event,
)
from schemas.events import EventBase
from tests.helpers import local_success

T0 = 1_800_000_000.0
DAY = 86_400.0


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, UTC)


def read(event: EventBase) -> Event:
    """The event as another host reads it off the topic."""
    return parse_event(event.model_dump_json().encode())


def accepted(request_id: str, team: str | None, seconds: float) -> Event:
    return read(
        Accepted(
            request_id=request_id, method="sft", team=team, priority_class="batch" if team else None, time=at(seconds)
        )
    )


def succeeded(
    request_id: str,
    seconds: float,
    durations_s: dict[str, float] | None = None,
    method: str = "sft",
    model: str = "tiny/m",
    metrics: dict[str, float] | None = None,
    **fields: Any,
) -> Event:
    return read(
        local_success(
            request_id,
            time=at(seconds),
            metrics=metrics or {},
            durations_s=durations_s or {},
            method=method,
            base_model=model,
            **fields,
        )
    )


def fold(usage: Usage, *events: Event, now: float = T0 + DAY) -> Usage:
    for event in events:
        usage.observe(event, now)
    return usage


def test_a_job_holds_its_slot_from_accepted_to_its_terminal_event() -> None:
    usage = fold(Usage(half_life_s=1e12), accepted("r1", "a", 0))
    assert usage.running() == {"a": 1}
    assert usage.slot_seconds(T0 + 40) == {"a": pytest.approx(40.0)}  # a running job counts up to now
    fold(usage, succeeded("r1", 100))
    assert usage.running() == {}
    assert usage.slot_seconds(T0 + 500) == {"a": pytest.approx(100.0)}


@pytest.mark.parametrize(
    "end",
    [
        Preempted(request_id="r1", by="u1", priority_class="batch", preemptions=1, step=7, time=at(30)),
        Retrying(request_id="r1", code="x", message="m", stage="train", max_attempts=3, time=at(30)),
        Failed(request_id="r1", code="x", message="m", stage="train", retryable=False, time=at(30)),
        Cancelled(request_id="r1", reason="asked", time=at(30)),
    ],
    ids=lambda e: e.type,
)
def test_every_event_that_frees_the_slot_ends_the_stretch(end: EventBase) -> None:
    usage = fold(Usage(half_life_s=1e12), accepted("r1", "a", 0), read(end))
    assert usage.running() == {} and usage.slot_seconds(T0 + 500) == {"a": pytest.approx(30.0)}


def test_a_preempted_job_accepted_again_adds_its_second_stretch_and_not_the_wait_between() -> None:
    preempted = read(Preempted(request_id="r1", by="u1", priority_class="batch", preemptions=1, time=at(30)))
    usage = fold(
        Usage(half_life_s=1e12), accepted("r1", "b", 0), preempted, accepted("r1", "b", 200), succeeded("r1", 250)
    )
    assert usage.slot_seconds(T0 + 1000) == {"b": pytest.approx(80.0)}


def test_a_job_interrupted_without_an_event_ends_where_it_is_accepted_again() -> None:
    usage = fold(Usage(half_life_s=1e12), accepted("r1", "a", 0), accepted("r1", "a", 60))
    assert usage.running() == {"a": 1}  # one job, not two
    assert usage.slot_seconds(T0 + 100) == {"a": pytest.approx(100.0)}


def test_started_names_the_slots_a_job_holds() -> None:
    started = read(Started(request_id="r1", method="sft", slot="0,1", pid=9, time=at(10)))
    usage = fold(Usage(half_life_s=1e12), accepted("r1", "a", 0), started)
    assert usage.running() == {"a": 2}
    assert usage.slot_seconds(T0 + 20) == {"a": pytest.approx(10.0 + 2 * 10.0)}
    cpu = read(Started(request_id="r2", method="sft", slot="cpu", pid=9, time=at(10)))
    assert fold(Usage(), accepted("r2", "c", 0), cpu).running() == {"c": 1}
    # A started event of a job whose accepted event this reader never saw says nothing of its team: ignored.
    assert fold(Usage(), started).running() == {}


def test_a_hosts_own_requests_replace_what_the_events_say_of_them_in_the_slots_held() -> None:
    # Issue 57: this host knows at once what it claimed (held before its `accepted`) and what it freed (a job's slots
    # free when its child exits, before its outcome is published); the other hosts' jobs are as the events say.
    usage = fold(Usage(), accepted("mine-done", "a", 0), accepted("theirs", "a", 0))
    assert usage.running() == {"a": 2}
    assert usage.running({"mine-done": ("a", 0), "mine-claimed": ("b", 2)}) == {"a": 1, "b": 2}


def test_slot_time_decays_by_its_half_life() -> None:
    usage = fold(Usage(half_life_s=100.0), accepted("r1", "a", 0), succeeded("r1", 100))
    at_end = usage.slot_seconds(T0 + 100)["a"]
    assert at_end == pytest.approx(
        50.0 / math.log(2)
    )  # the first half of the stretch has decayed by more than the last
    assert usage.slot_seconds(T0 + 200)["a"] == pytest.approx(at_end / 2)
    assert usage.slot_seconds(T0 + 1100)["a"] == pytest.approx(at_end / 1024)


def test_a_host_without_classes_is_the_default_team_and_other_events_change_nothing() -> None:
    progress = read(Progress(request_id="r1", step=1, total_steps=4, time=at(5)))
    queued = read(Queued(request_id="r2", priority_class="batch", team="z", place=1, time=at(5)))
    usage = fold(Usage(half_life_s=1e12), accepted("r1", None, 0), progress, queued)
    assert usage.running() == {"default": 1}


def test_a_clock_running_ahead_adds_no_slot_time_from_the_future() -> None:
    usage = Usage(half_life_s=1e12)
    usage.observe(accepted("r1", "a", 0), now=T0)
    usage.observe(succeeded("r1", 3600), now=T0 + 60)  # its host's clock an hour ahead of ours
    assert usage.slot_seconds(T0 + 60) == {"a": pytest.approx(60.0)}


def test_usage_folded_from_events_tilts_the_fleets_order() -> None:
    usage = fold(Usage(), accepted("a1", "a", 0), succeeded("a1", 3000), accepted("a2", "a", 0), now=T0 + 3000)
    waiting = [
        FleetRequest(f"{team}{i}", "batch", team, T0 + 3000 + i, "sft", "tiny/m") for team in "ab" for i in range(3)
    ]
    order = fleet_order(
        waiting, Standing([PriorityClass(name="batch")], usage=usage.slot_seconds(T0 + 3000), holding=usage.running())
    )
    assert [w.team for w in order] == ["b", "b", "b", "a", "a", "a"]


def test_durations_are_the_slot_time_of_successes_and_leave_duplicates_out() -> None:
    durations = Durations()
    durations.observe(succeeded("r1", 0, {"queue": 5.0, "train": 80.0, "push": 10.0, "total": 105.0}), T0)
    assert durations.expected("sft", "tiny/m") == pytest.approx(90.0)
    durations.observe(succeeded("r2", 0, {}, duplicate=True), T0)  # answered from an earlier success: trained nothing
    durations.observe(read(Failed(request_id="r3", code="x", message="m", stage="train", retryable=False)), T0)
    assert durations.expected("sft", "tiny/m") == pytest.approx(90.0)


def test_a_requests_length_is_expected_at_the_steady_pace_of_finished_steps() -> None:
    # 10 steps in 10 s of training, the first of them 5.5 s of set-up: the steady pace is 0.5 s a step. The job held
    # its slot 20 s: 15 s of it outside the steady steps. One of 40 steps is expected at 15 + 40 x 0.5 = 35 s.
    metrics = {"train_runtime": 10.0, "train_steps_per_second": 1.0, "median_step_s": 0.5}
    durations = Durations()
    durations.observe(succeeded("r1", 0, {"total": 20.0}, metrics=metrics), T0)
    assert durations.expected("sft", "tiny/m", 40) == pytest.approx(35.0) and durations.step_s("sft", "tiny/m") == 0.5
    # Without the pace, the runtime over the steps: 1 s a step with the set-up in each, 10 + 40 x 1 = 50 s.
    blind = Durations()
    blind.observe(
        succeeded("r1", 0, {"total": 20.0}, metrics={"train_runtime": 10.0, "train_steps_per_second": 1.0}), T0
    )
    assert blind.expected("sft", "tiny/m", 40) == pytest.approx(50.0)


def test_expected_is_the_median_of_the_same_method_and_model_else_the_method_else_all() -> None:
    durations = Durations()
    assert durations.expected("sft", "m") is None
    for seconds in (10.0, 30.0, 1000.0):
        durations.add("sft", "m", seconds)
    durations.add("sft", "other", 50.0)
    durations.add("grpo", "m", 500.0)
    assert durations.expected("sft", "m") == 30.0  # the median, not thrown by the one slow job
    assert durations.expected("sft", "unseen") == 40.0  # sft of any model: 10, 30, 50, 1000
    assert durations.expected("dpo", "m") == 50.0  # any job: 10, 30, 50, 500, 1000


def test_durations_keep_the_recent_window() -> None:
    durations = Durations(window=3)
    for seconds in (1000.0, 1000.0, 1000.0, 10.0, 10.0):
        durations.add("sft", "m", seconds)
    assert durations.expected("sft", "m") == 10.0


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="half_life_s"):
        Usage(half_life_s=0)
    with pytest.raises(ValueError, match="window"):
        Durations(window=0)


def test_the_fleets_running_jobs_are_folded_from_their_events() -> None:
    jobs = Occupancy()
    events = [
        read(Accepted(request_id="r1", method="dpo", team="a", priority_class="batch", host="h1", time=at(0))),
        read(Started(request_id="r1", method="dpo", slot="2,3", pid=9, host="h1", time=at(5))),
        read(Progress(request_id="r1", step=10, total_steps=40, eta_s=300.0, time=at(60))),
        read(Checkpoint(request_id="r1", step=8, path="/j/checkpoint-8", time=at(61))),
        read(Progress(request_id="r1", step=12, total_steps=40, eta_s=280.0, time=at(70))),
        accepted("r2", None, 30),
    ]
    for event in events:
        jobs.observe(event, T0 + 100)
    by_id = {job.request_id: job for job in jobs.jobs(T0 + 100)}
    r1 = by_id["r1"]
    assert (r1.priority_class, r1.team, r1.method, r1.host, r1.started, r1.gpus) == ("batch", "a", "dpo", "h1", T0, 2)
    assert r1.eta_s == pytest.approx(250.0)  # 280 s said 30 s ago
    assert r1.steps_since_checkpoint == 4 and r1.preemptions == 0 and r1.steps_left == 28
    assert jobs.jobs(T0 + 1000)[0].eta_s == 0.0  # never below nothing
    r2 = by_id["r2"]
    assert (r2.team, r2.eta_s, r2.steps_since_checkpoint, r2.steps_left, r2.gpus) == (
        "default",
        None,
        None,
        None,
        1,
    )  # nothing known yet


def test_a_job_with_no_progress_yet_has_the_model_and_steps_its_accepted_event_named() -> None:
    jobs = Occupancy()
    jobs.observe(
        read(
            Accepted(
                request_id="r1",
                method="sft",
                team="a",
                priority_class="batch",
                model="org/base",
                max_steps=40,
                time=at(0),
            )
        ),
        T0 + 10,
    )
    [job] = jobs.jobs(T0 + 10)
    assert (job.model, job.steps_left) == ("org/base", 40)  # not the method's median job: its own 40 steps
    jobs.observe(read(Started(request_id="r1", method="sft", slot="cpu", pid=9, resumed_step=8, time=at(1))), T0 + 10)
    assert jobs.jobs(T0 + 10)[0].steps_left == 32  # resumed at step 8
    jobs.observe(read(Progress(request_id="r1", step=10, total_steps=40, time=at(5))), T0 + 10)
    assert jobs.jobs(T0 + 10)[0].steps_left == 30  # its progress says more
    jobs.observe(accepted("r2", "a", 20), T0 + 30)  # a host with no classes names neither
    assert (jobs.jobs(T0 + 30)[-1].model, jobs.jobs(T0 + 30)[-1].steps_left) == ("", None)


def test_a_preempted_job_leaves_the_running_and_comes_back_counting_its_preemptions() -> None:
    jobs = Occupancy()
    for event in [
        accepted("r1", "a", 0),
        read(Preempted(request_id="r1", by="u", priority_class="batch", preemptions=1, time=at(50))),
    ]:
        jobs.observe(event, T0 + 100)
    assert jobs.jobs(T0 + 100) == []
    jobs.observe(accepted("r1", "a", 200), T0 + 300)
    jobs.observe(
        read(Started(request_id="r1", method="sft", slot="cpu", pid=9, resumed_step=8, time=at(201))), T0 + 300
    )
    jobs.observe(read(Progress(request_id="r1", step=11, total_steps=40, time=at(250))), T0 + 300)
    [again] = jobs.jobs(T0 + 300)
    assert (
        again.preemptions == 1 and again.started == T0 + 200 and again.steps_since_checkpoint == 3
    )  # from the step it resumed at
    jobs.observe(succeeded("r1", 400), T0 + 400)
    assert jobs.jobs(T0 + 400) == []
    jobs.observe(accepted("r1", "a", 500), T0 + 500)  # a request id used again after its end: a new request
    assert jobs.jobs(T0 + 500)[0].preemptions == 0


def test_retrying_and_every_terminal_event_end_a_running_job() -> None:
    ends = [
        read(Retrying(request_id="r1", code="x", message="m", stage="train", max_attempts=3, time=at(9))),
        read(Cancelled(request_id="r1", reason="asked", time=at(9))),
        succeeded("r1", 9),
        read(Failed(request_id="r1", code="x", message="m", stage="train", retryable=False, time=at(9))),
    ]
    for end in ends:
        jobs = Occupancy()
        jobs.observe(accepted("r1", "a", 0), T0 + 10)
        jobs.observe(end, T0 + 10)
        assert jobs.jobs(T0 + 10) == [], end.type
    # Events of a job this reader never saw accepted say nothing it can place.
    jobs = Occupancy()
    jobs.observe(read(Progress(request_id="zz", step=1, total_steps=2, eta_s=5.0, time=at(1))), T0 + 10)
    assert jobs.jobs(T0 + 10) == []
