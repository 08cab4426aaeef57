"""The fleet's order and its preemption choice, as pure functions (daemon/fleet/policy/order.py): class first,
fair share between teams by weight (usage tilting it back, idle share lent, caps hard), then arrival;
the victim of a preemption within the operator's bounds, losing the least work.
(An unknown class is refused at intake: tests/daemon/intake/test_policy.py.)"""

from __future__ import annotations

from collections import Counter

from daemon.fleet.policy.order import (
    DEFAULT_WORK_S,
    FleetJob,
    FleetRequest,
    Standing,
    fleet_order,
    pick,
    remaining_work,
    victim,
)
from daemon.fleet.policy.replay import Arrival, Trace, replay
from daemon.fleet.policy.usage import Durations
from daemon.settings.fleet import PriorityClass, TeamShare

CLASSES = [
    PriorityClass(name="urgent"),
    PriorityClass(name="default", preemptible=True),
    PriorityClass(name="batch", preemptible=True),
]


def waiting(
    request_id: str, team: str = "a", cls: str = "default", arrived: float = 0.0, gpus: int = 1, method: str = "sft"
) -> FleetRequest:
    return FleetRequest(request_id, cls, team, arrived, method, "tiny", gpus=gpus)


def sweep(team: str, count: int, cls: str = "default", start: float = 0.0) -> list[FleetRequest]:
    return [waiting(f"{team}{i}", team, cls, arrived=start + i) for i in range(count)]


def ids(order: list[FleetRequest]) -> list[str]:
    return [w.request_id for w in order]


def test_a_higher_class_goes_first_whatever_its_arrival_then_arrival_within_a_class() -> None:
    batch = [waiting("b1", cls="batch", arrived=1), waiting("b2", cls="batch", arrived=2)]
    urgent = [waiting("u1", cls="urgent", arrived=9), waiting("u2", cls="urgent", arrived=5)]
    default = [waiting("d1", arrived=3)]
    assert ids(fleet_order(batch + default + urgent, Standing(CLASSES))) == ["u2", "u1", "d1", "b1", "b2"]


def test_a_class_the_operator_removed_goes_after_every_known_one() -> None:
    order = fleet_order(
        [waiting("gone", cls="old", arrived=0), waiting("b", cls="batch", arrived=5)], Standing(CLASSES)
    )
    assert ids(order) == ["b", "gone"]


def test_under_contention_slot_time_follows_the_weights_2_to_1() -> None:
    order = fleet_order(
        sweep("a", 30) + sweep("b", 30), Standing(CLASSES, {"a": TeamShare(weight=2), "b": TeamShare(weight=1)})
    )
    assert len(order) == 60
    assert Counter(w.team for w in order[:30]) == {"a": 20, "b": 10}
    # Interleaved all along, not one team's block then the other's: every 3 places hold 2 of a, 1 of b.
    assert all(Counter(w.team for w in order[i : i + 3]) == {"a": 2, "b": 1} for i in range(0, 30, 3))
    # Within a team, arrival order.
    assert ids([w for w in order if w.team == "a"]) == [f"a{i}" for i in range(30)]
    # Usage tilts it back: a team that used 40 jobs' worth lately, twice its share of b's none, waits while b
    # catches up to half of that (20 jobs), then the 2:1 interleaving resumes.
    tilted = fleet_order(
        sweep("a", 30) + sweep("b", 30), Standing(CLASSES, {"a": TeamShare(weight=2)}, {"a": 40 * DEFAULT_WORK_S})
    )
    assert [w.team for w in tilted[:20]] == ["b"] * 20 and Counter(w.team for w in tilted[20:29]) == {"a": 6, "b": 3}


def test_slots_that_free_together_still_follow_the_weights_counting_the_work_under_way() -> None:
    # Three slots of a simulated fleet: the starts at one moment count each other's work (remaining_work),
    # or all three would go to the team that leads at that moment (18:12 instead of 20:10).
    arrivals = tuple(
        Arrival(at=0.0, duration_s=10.0, team=team, request_id=f"{team}{i}") for team in "ab" for i in range(30)
    )
    outcomes = replay(
        Trace(arrivals, slots=3, teams={"a": TeamShare(weight=2)}, history=(("sft", "tiny", 10.0, None),))
    )
    first = sorted(outcomes, key=lambda o: (o.started or 0.0, o.request_id))[:30]
    assert Counter(o.request_id[0] for o in first) == {"a": 20, "b": 10}


def test_the_work_under_way_is_each_jobs_eta_else_its_expected_rest() -> None:
    jobs = [
        FleetJob("r1", "batch", "a", 0.0, "sft", "tiny", eta_s=30.0, gpus=2),
        FleetJob("r2", "batch", "a", 0.0, "sft", "tiny"),
        FleetJob("r3", "batch", "b", 0.0, "sft", "tiny"),
        FleetJob("r4", "batch", "c", 0.0, "grpo", "x"),
    ]
    durations = Durations()
    durations.add("sft", "tiny", 100.0)
    assert remaining_work(jobs, durations, now=60.0) == {"a": 60.0 + 40.0, "b": 40.0, "c": 40.0}
    assert remaining_work(jobs[1:2], durations, now=500.0) == {"a": 0.0}  # overdue: nothing more is counted
    assert remaining_work(jobs[1:2], None, now=0.0) == {"a": DEFAULT_WORK_S}
    # Counted as work placed ahead: a's running jobs put b's first.
    order = fleet_order(sweep("a", 2) + sweep("b", 2), Standing(CLASSES, ahead={"a": 50.0}, pace=durations))
    assert ids(order) == ["b0", "a0", "b1", "a1"]


def test_equal_weights_alternate_and_past_usage_tilts_the_order_back() -> None:
    requests = sweep("a", 10) + sweep("b", 10)
    assert [w.team for w in fleet_order(requests, Standing(CLASSES))[:4]] == ["a", "b", "a", "b"]
    # Team a used 5 jobs' worth of slot-time lately: b's first 5 go ahead of any of a's, then they alternate.
    tilted = fleet_order(requests, Standing(CLASSES, usage={"a": 5 * DEFAULT_WORK_S}))
    assert [w.team for w in tilted[:7]] == ["b"] * 5 + ["a", "b"]


def test_the_work_placed_ahead_is_the_expected_duration_so_long_jobs_count_for_more() -> None:
    durations = Durations()
    durations.add("grpo", "tiny", 300.0)
    durations.add("sft", "tiny", 100.0)
    long_jobs = [waiting(f"a{i}", "a", arrived=i, method="grpo") for i in range(6)]
    short_jobs = [waiting(f"b{i}", "b", arrived=i, method="sft") for i in range(6)]
    order = fleet_order(long_jobs + short_jobs, Standing(CLASSES, pace=durations))
    # Each of a's takes 300 s, each of b's 100 s: after a's first, three of b's catch up with it.
    assert [w.team for w in order[:8]] == ["a", "b", "b", "b", "a", "b", "b", "b"]


def test_weights_share_within_a_class_and_a_higher_class_still_goes_first() -> None:
    requests = sweep("a", 4, cls="batch") + sweep("b", 4, cls="batch") + [waiting("u", "b", "urgent", arrived=99)]
    order = fleet_order(requests, Standing(CLASSES, {"a": TeamShare(weight=3)}))
    assert ids(order)[0] == "u"
    # b's urgent request counts as b's work placed ahead: a's weight of 3 leads the batch class by one more.
    assert [w.team for w in order[1:5]] == ["a", "a", "a", "b"]
    without = fleet_order(requests[:-1], Standing(CLASSES, {"a": TeamShare(weight=3)}))
    assert [w.team for w in without[:4]] == ["a", "b", "a", "a"]


def test_share_left_idle_is_lent_a_team_alone_gets_every_slot() -> None:
    alone = sweep("b", 5)
    teams = {"a": TeamShare(weight=10), "b": TeamShare(weight=1)}
    # Team a, with ten times b's weight, waits for nothing: each of 5 free slots takes b's next.
    held: dict[str, int] = {}
    taken = []
    for _ in range(5):
        head = pick([w for w in alone if w.request_id not in taken], Standing(CLASSES, teams, {"a": 0.0}, held))
        assert head is not None
        taken.append(head.request_id)
        held["b"] = held.get("b", 0) + 1
    assert taken == ["b0", "b1", "b2", "b3", "b4"]


def test_a_cap_is_hard_a_free_slot_stays_free_rather_than_exceed_it() -> None:
    teams = {"a": TeamShare(max_slots=2)}
    assert pick(sweep("a", 3), Standing(CLASSES, teams, holding={"a": 2})) is None
    assert ids([pick(sweep("a", 3), Standing(CLASSES, teams, holding={"a": 1}))]) == ["a0"]  # type: ignore[list-item]
    # A request needing two GPUs does not fit a cap with one left, whatever the free slots.
    assert pick([waiting("big", "a", gpus=2)], Standing(CLASSES, teams, holding={"a": 1})) is None


def test_a_team_at_its_cap_is_skipped_while_another_waits_and_its_rest_goes_last() -> None:
    teams = {"a": TeamShare(weight=10, max_slots=2)}
    order = fleet_order(sweep("a", 4) + sweep("b", 3, start=10), Standing(CLASSES, teams, {"b": 10 * DEFAULT_WORK_S}))
    # a's weight and b's past usage would put all 4 of a's first; its cap lets 2 of them ahead, the rest after b's.
    assert ids(order) == ["a0", "a1", "b0", "b1", "b2", "a2", "a3"]
    # Slots a already holds count against the cap.
    assert ids(
        fleet_order(
            sweep("a", 2) + sweep("b", 1, start=10), Standing(CLASSES, teams, {"b": 10 * DEFAULT_WORK_S}, {"a": 2})
        )
    ) == ["b0", "a0", "a1"]


def test_pick_passes_over_a_capped_or_too_large_head_for_one_that_fits() -> None:
    heads = [
        waiting("u", "a", "urgent", arrived=5),
        waiting("big", "b", "urgent", arrived=0, gpus=2),
        waiting("d", "c", arrived=0),
    ]
    teams = {"a": TeamShare(max_slots=1)}
    picked = pick(heads, Standing(CLASSES, teams, holding={"a": 1}), free=1)
    assert picked is not None and picked.request_id == "d"
    picked = pick(heads, Standing(CLASSES, teams, holding={"a": 0}), free=1)
    assert picked is not None and picked.request_id == "u"
    picked = pick(heads, Standing(CLASSES, teams), free=2)
    assert picked is not None and picked.request_id == "big"
    assert pick([], Standing(CLASSES, teams)) is None


def running(
    request_id: str,
    cls: str = "batch",
    started: float = 0.0,
    preemptions: int = 0,
    steps: int | None = 0,
    preemptible: bool = True,
    gpus: int = 1,
) -> FleetJob:
    return FleetJob(
        request_id,
        cls,
        "a",
        started,
        "sft",
        "tiny",
        preemptible=preemptible,
        preemptions=preemptions,
        steps_since_checkpoint=steps,
        gpus=gpus,
    )


def chosen(
    head: FleetRequest,
    jobs: list[FleetJob],
    min_run_s: float = 60.0,
    max_count: int = 2,
    now: float = 1000.0,
    free: int = 0,
) -> str | None:
    found = victim(head, jobs, CLASSES, min_run_s, max_count, now, free=free)
    return None if found is None else found.request_id


URGENT = waiting("u", "b", "urgent", arrived=999)


def test_a_victim_has_run_its_minimum_time_and_has_preemptions_left() -> None:
    assert chosen(URGENT, [running("young", started=950)]) is None  # ran 50 s of the 60
    assert chosen(URGENT, [running("old-enough", started=940)]) == "old-enough"  # exactly 60 s
    assert chosen(URGENT, [running("twice", preemptions=2)]) is None
    assert chosen(URGENT, [running("once", preemptions=1)]) == "once"
    assert chosen(URGENT, [running("any")], max_count=0) is None


def test_a_victim_is_preemptible_by_its_class_and_as_a_job_and_of_a_lower_class_only() -> None:
    assert chosen(URGENT, [running("peer", cls="urgent")]) is None  # same class: never
    assert chosen(waiting("b", cls="batch"), [running("peer", cls="batch")]) is None
    assert chosen(waiting("d", cls="default"), [running("higher", cls="urgent")]) is None  # a higher class: never
    classes = [
        PriorityClass(name="urgent"),
        PriorityClass(name="default"),
        PriorityClass(name="batch", preemptible=True),
    ]
    assert victim(URGENT, [running("d", cls="default")], classes, 0, 9, 1000) is None  # its class may not be preempted
    assert chosen(URGENT, [running("pushing", preemptible=False)]) is None  # the job itself cannot stop now
    assert chosen(waiting("x", cls="removed"), [running("b")]) is None  # a head of no known class preempts nothing
    assert chosen(waiting("d", cls="default"), [running("b", cls="batch")]) == "b"


def test_the_victim_loses_the_least_work_then_is_of_the_lowest_class_then_the_latest_started() -> None:
    jobs = [running("far", steps=40), running("near", steps=3), running("unknown", steps=None)]
    assert chosen(URGENT, jobs) == "near"
    assert chosen(URGENT, [running("unknown", steps=None), running("far", steps=400)]) == "far"  # unknown is the worst
    assert chosen(URGENT, [running("default", cls="default", steps=3), running("batch", steps=3)]) == "batch"
    assert chosen(URGENT, [running("earlier", started=100, steps=3), running("later", started=500, steps=3)]) == "later"


def test_a_victim_frees_enough_gpus_for_the_head() -> None:
    pair = waiting("pair", "b", "urgent", gpus=2)
    assert chosen(pair, [running("one", steps=0)]) is None  # one GPU freed of the two it needs
    assert chosen(pair, [running("one", steps=0)], free=1) == "one"  # with the host's free one
    assert chosen(pair, [running("one", steps=0), running("two", steps=5, gpus=2)]) == "two"
