"""Who waits, in what order, and when it starts, decided without a broker: the records past the
queues' committed offsets and the events, as daemon/cli/waiting.py, places.py and sweep.py fold
them (the real broker end to end: test_queue_cli.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.cancels_sent import SentControl, mark_sent
from daemon.cli.places import default_slots, place_and_eta, queue_table, where_it_waits
from daemon.cli.sweep import matches, selector
from daemon.cli.waiting import Queue, SentCancel, WaitingRequest, combine
from daemon.errors import UsageError
from daemon.settings import Settings
from daemon.settings.fleet import PriorityClass
from schemas import Event, parse_event
from testbed.fleet_keys import shared_fleet_keys
from testbed.memory_kafka import FakeRecord
from tests.helpers import event_document, sft_request

NOW = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
CLASSES = [PriorityClass(name="urgent"), PriorityClass(name="batch", preemptible=True)]
URGENT = Queue("g.queue.urgent", "requests.urgent", "unread", "urgent")
BATCH = Queue("g.queue.batch", "requests", "unread", "batch")
CLAIMS = Queue("g", "claims", "claimed", None)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        work_dir=tmp_path, priority_classes=CLASSES, claims_topic="claims", group_id="g", **shared_fleet_keys()
    )


def event(kind: str, request_id: str, minutes_ago: float, host: str = "gpu-a", **fields: Any) -> Event:
    document = event_document(
        kind, request_id=request_id, host=host, time=(NOW - timedelta(minutes=minutes_ago)).isoformat(), **fields
    )
    return parse_event(json.dumps(document).encode())


def record(
    queue: Queue,
    offset: int,
    minutes_ago: float,
    request: dict[str, Any] | None = None,
    raw: bytes | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
) -> tuple[Queue, FakeRecord]:
    value = raw if raw is not None else json.dumps(request).encode()
    key = request["request_id"].encode() if request else b"junk-1"
    stamp = int((NOW - timedelta(minutes=minutes_ago)).timestamp() * 1000)
    return queue, FakeRecord(queue.topic, 0, offset, key, value, headers or [], stamp)


def test_a_request_waits_where_its_record_is_unless_its_events_say_it_runs_or_ended(settings: Settings) -> None:
    read = [
        record(URGENT, 0, 1, sft_request("u1", priority_class="urgent", team="fixes")),
        record(URGENT, 1, 1, raw=b"{not json"),
        record(BATCH, 4, 30, sft_request("b1", team="search", metadata={"sweep": "s1"})),
        record(BATCH, 5, 20, sft_request("p1", team="search"), headers=[("adapterd-preemptions", b"1")]),
        record(BATCH, 6, 50, sft_request("e1")),  # ended after this record was written: about to be committed
        record(BATCH, 7, 5, sft_request("e2")),  # sent again after it ended
        record(CLAIMS, 0, 25, sft_request("r1", team="search", metadata={"sweep": "s1"})),
        record(CLAIMS, 1, 15, sft_request("k1")),
        record(
            CLAIMS, 2, 14, sft_request("k2"), headers=[("adapterd-class", b"urgent")]
        ),  # claimed from urgent's topic, naming no class
        record(CLAIMS, 3, 3, sft_request("k3")),  # held by a dispatcher (its `queued` event), then claimed
    ]
    events = [
        event("accepted", "r1", 24, method="sft", priority_class="batch", team="search"),
        event("started", "r1", 24, method="sft"),
        event("accepted", "p1", 40, method="sft"),
        event("started", "p1", 39, method="sft"),
        event("preempted", "p1", 10, by="u0", priority_class="batch", preemptions=1, step=12),
        event("accepted", "e1", 45, method="sft"),
        event("succeeded", "e1", 40, method="sft"),
        event("accepted", "e2", 45, method="sft"),
        event("failed", "e2", 40, code="dataset_invalid", stage="preflight"),
        event("queued", "h1", 8, host="gpu-b", priority_class="batch", team="ads", place=3, eta_s=60.0),
        event("queued", "k3", 4, host="gpu-b", priority_class="batch", team="default", place=9, eta_s=None),
    ]
    backlog = combine(read, events, settings)
    waiting = {w.request_id: w for w in backlog.waiting}
    assert set(waiting) == {"u1", "junk-1", "b1", "p1", "e2", "k1", "k2", "k3", "h1"}  # r1 runs; e1 ended
    assert (waiting["k3"].stage, waiting["k3"].where) == ("claimed", "claims[0]@3")
    assert waiting["k2"].priority_class == "urgent"  # the class the dispatcher claimed it as
    assert (waiting["u1"].priority_class, waiting["u1"].team, waiting["u1"].stage, waiting["u1"].where) == (
        "urgent",
        "fixes",
        "unread",
        "requests.urgent[0]@0",
    )
    assert (waiting["b1"].priority_class, waiting["b1"].team) == ("batch", "search")  # no class named: its queue's
    assert (
        waiting["k1"].stage == "claimed"
        and waiting["k1"].where == "claims[0]@1"
        and waiting["k1"].priority_class == "batch"
    )
    assert (
        waiting["p1"].stage == "preempted"
        and waiting["p1"].where == "requests[0]@5"
        and "preempted 1x" in waiting["p1"].detail
    )
    assert waiting["p1"].arrived == NOW - timedelta(minutes=40)  # its first event, not the record put back
    assert waiting["e2"].stage == "unread"
    assert (waiting["h1"].stage, waiting["h1"].where, waiting["h1"].priority_class, waiting["h1"].team) == (
        "queued",
        "on gpu-b",
        "batch",
        "ads",
    )
    assert waiting["junk-1"].stage == "undecodable" and "not a request (not_json" in waiting["junk-1"].detail
    assert backlog.records["r1"].metadata == {"sweep": "s1"}  # a running request's record, for the sweep

    # The fleet's order (daemon/fleet/policy/order.py): the class first; within batch the fair share puts ads, which
    # has had no slot-time, ahead of the teams that have, though h1 arrived after p1, b1 and k1.
    placed = place_and_eta(backlog.waiting, events, settings, 2, NOW)
    assert [p.request.request_id for p in placed][:3] == ["u1", "k2", "h1"] and placed[
        -1
    ].request.request_id == "junk-1"
    assert [p.place for p in placed] == [1, 2, 3, 4, 5, 6, 7, 8, None] and placed[-1].eta_s is None


def test_a_request_with_a_cancel_pending_leaves_the_queue_at_once_and_counts_in_no_ones_place(
    settings: Settings,
) -> None:
    """Issue 57: a waiting request cancelled was listed waiting, placed and counted ahead of the others until its
    `cancelled` event, which comes only when a host reaches it."""
    read = [
        record(BATCH, 0, 9, sft_request("b1")),
        record(BATCH, 1, 8, sft_request("b2")),
        record(BATCH, 2, 7, sft_request("b3")),
        record(URGENT, 0, 1, raw=b"{not json"),
    ]
    events = [
        event("accepted", "gone-1", 30, method="sft"),
        event("cancelled", "gone-1", 20, reason="done with it"),
        event("queued", "h1", 6, host="gpu-b", priority_class="batch", team="ads", place=4, eta_s=None),
    ]
    sent = NOW - timedelta(seconds=5)
    backlog = combine(read, events, settings)
    mark_sent(
        backlog.waiting,
        SentControl(
            cancels={
                "b2": SentCancel(sent, "sweep withdrawn"),
                "h1": SentCancel(sent, "cancelled"),
                "gone-1": SentCancel(sent, "again"),
                "junk-1": SentCancel(sent, "cancelled"),
            }
        ),
    )
    placed = {p.request.request_id: p for p in place_and_eta(backlog.waiting, events, settings, 1, NOW)}
    assert set(placed) == {"b1", "b2", "b3", "h1", "junk-1"}  # gone-1 ended: its cancel changes nothing
    assert [(p.request.request_id, p.place, p.of) for p in placed.values() if p.place is not None] == [
        ("b1", 1, 2),
        ("b3", 2, 2),
    ]
    assert (placed["b2"].place, placed["b2"].eta_s, placed["h1"].place) == (None, None, None)
    assert placed["junk-1"].request.cancel is None  # not a request: no cancel to honour, listed as it was

    listed, pending = queue_table(list(placed.values()), None, None, None, NOW)
    assert [each.request.request_id for each in listed] == ["b1", "b3", "junk-1"]
    assert (
        pending is not None
        and pending.startswith("2 waiting request(s) with a cancel pending")
        and "b2 (sent " in pending
        and "h1 (sent " in pending
    )
    assert (
        queue_table(list(placed.values()), None, "gpu-b", None, NOW)[1] is not None
    )  # the filters take h1 (its host's)
    assert queue_table(list(placed.values()), "dpo", None, None, NOW)[1] is None  # ...and none of them here
    assert where_it_waits(placed["b2"], NOW) == (
        f"b2: cancel pending (sent {sent:%Y-%m-%d %H:%M:%S}Z: sweep withdrawn), its `cancelled` event not "
        "yet published: it waits (unread) in requests[0]@1 until a host reaches it and skips it, placed "
        "nowhere and counted in no one's place"
    )


def test_a_request_held_before_any_host_reached_it_is_listed_held_and_placed_nowhere(settings: Settings) -> None:
    """A hold is honoured when a host reaches the request (its `held` event): until then the control topic's hold, with
    no release after it, keeps it out of the order, as a cancel pending does; one released again is placed."""
    read = [record(BATCH, 0, 9, sft_request("b1")), record(BATCH, 1, 8, sft_request("b2"))]
    backlog = combine(read, [], settings)
    mark_sent(backlog.waiting, SentControl(held={"b1": "maintenance"}))
    placed = {p.request.request_id: p for p in place_and_eta(backlog.waiting, [], settings, 1, NOW)}
    assert (placed["b1"].place, placed["b1"].request.stage, placed["b1"].request.detail) == (
        None,
        "held",
        "hold sent: maintenance",
    )
    assert (placed["b2"].place, placed["b2"].of) == (1, 1)  # b1 counted in no one's place


def test_a_waiting_requests_line_says_one_place_and_one_eta_and_when_they_were_worked_out(settings: Settings) -> None:
    """Issue 57: `get` printed the place and ETA of the request's last `queued` event beside a fresh
    one, not saying which held."""
    events = [event("queued", "h1", 6, host="gpu-b", priority_class="batch", team="ads", place=4, eta_s=600.0)]
    backlog = combine([record(BATCH, 0, 9, sft_request("b1", team="search"))], events, settings)
    placed = {p.request.request_id: p for p in place_and_eta(backlog.waiting, events, settings, 2, NOW)}
    line = where_it_waits(placed["h1"], NOW)
    assert line == (
        "h1: waiting (queued) on gpu-b, class batch, team ads, place 2 of 2, starts in about 0s; "
        "worked out at 18:00:00Z from the queues and the events"
    )
    assert (
        line.count("place") == 1 and "600" not in line
    )  # the event's place 4 and its 600 s are not repeated as if current


def test_without_classes_the_requests_topic_holds_the_running_job_and_those_behind_it(tmp_path: Path) -> None:
    plain = Settings(work_dir=tmp_path, group_id="g")
    queue = Queue("g", "requests", "unread", None)
    read = [
        record(queue, 3, 9, sft_request("running-1")),
        record(queue, 4, 8, sft_request("next-1")),
        record(queue, 5, 7, sft_request("next-2")),
    ]
    backlog = combine(
        read, [event("accepted", "running-1", 6, method="sft"), event("started", "running-1", 6, method="sft")], plain
    )
    assert [(w.request_id, w.priority_class, w.team, w.where) for w in backlog.waiting] == [
        ("next-1", None, "default", "requests[0]@4"),
        ("next-2", None, "default", "requests[0]@5"),
    ]


def test_without_classes_each_partition_is_its_own_queue_behind_the_job_that_holds_it(tmp_path: Path) -> None:
    plain = Settings(work_dir=tmp_path, group_id="g")
    model = sft_request("x")["model"]["id"]
    read = [
        record(Queue("g", "requests", "unread", None), offset, minutes_ago, sft_request(request_id))
        for offset, minutes_ago, request_id in ((3, 9, "running-1"), (4, 8, "n1"), (5, 7, "n2"))
    ]
    read.append(
        (
            Queue("g", "requests", "unread", None),
            FakeRecord(
                "requests",
                1,
                0,
                b"m1",
                json.dumps(sft_request("m1")).encode(),
                [],
                int((NOW - timedelta(minutes=1)).timestamp() * 1000),
            ),
        )
    )
    events = [
        succeeded("old-1", 100, 0, model=model),
        event("accepted", "running-1", 6, method="sft"),
        event("started", "running-1", 6, method="sft"),
        event("progress", "running-1", 0, step=5, total_steps=50, eta_s=30.0),
    ]
    backlog = combine(read, events, plain)
    placed = place_and_eta(backlog.waiting, events, plain, 1, NOW, backlog.records)
    # Partition 1 is free: m1 starts now, though it arrived last; n1 and n2 wait behind running-1 on partition 0,
    # n2 behind n1's 4 steps too, at old-1's pace: its 100 s less its steps' steady time, plus 4 such steps.
    metrics = events[0].metrics
    step_s, steps = metrics["median_step_s"], metrics["train_runtime"] * metrics["train_steps_per_second"]
    n1_s = 100 - step_s * steps + step_s * sft_request("n1")["training"]["max_steps"]
    assert [(p.request.request_id, p.place, p.of, p.eta_s) for p in placed] == [
        ("m1", 1, 1, 0.0),
        ("n1", 1, 2, pytest.approx(30.0)),
        ("n2", 2, 2, pytest.approx(30.0 + n1_s)),
    ]


def waiting(
    request_id: str,
    priority_class: str,
    minutes_ago: float,
    model: str = "m",
    method: str = "sft",
    steps: int | None = None,
) -> WaitingRequest:
    return WaitingRequest(
        request_id,
        priority_class,
        "t",
        NOW - timedelta(minutes=minutes_ago),
        method,
        model,
        1,
        {},
        "unread",
        "q[0]@0",
        steps=steps,
    )


def succeeded(
    request_id: str, total: float, queue: float, model: str = "m", method: str = "sft", **fields: Any
) -> Event:
    return event(
        "succeeded",
        request_id,
        60,
        method=method,
        base_model=model,
        durations_s={"queue": queue, "total": total},
        **fields,
    )


def test_place_is_class_then_arrival_and_the_eta_follows_the_slots_and_the_durations(settings: Settings) -> None:
    events = [
        succeeded("old-1", 100, 10),
        succeeded("old-2", 120, 10),  # sft on m holds a slot 90 and 110 s: median 100
        event("accepted", "run-1", 2, method="sft"),
        event("started", "run-1", 2, method="sft"),
        event("progress", "run-1", 10 / 60, step=5, total_steps=50, eta_s=30.0),  # said 10 s ago: 20 s left
    ]
    queue = [waiting("b-late", "batch", 5), waiting("b-early", "batch", 9), waiting("u", "urgent", 1)]
    placed = place_and_eta(queue, events, settings, 2, NOW)
    assert [(p.request.request_id, p.place, p.eta_s) for p in placed] == [
        ("u", 1, 0.0),  # the free slot, at once
        ("b-early", 2, pytest.approx(20.0)),  # run-1's slot when it ends
        ("b-late", 3, 100.0),  # u's slot after u's typical 100 s
    ]
    # One slot only, yet two jobs: the running ones are slots too.
    assert [p.eta_s for p in place_and_eta(queue, events, settings, 1, NOW)] == [
        pytest.approx(20.0),
        pytest.approx(120.0),
        pytest.approx(220.0),
    ]


def test_with_nothing_to_estimate_from_the_eta_is_unknown_not_guessed(settings: Settings) -> None:
    events = [
        event("accepted", "run-1", 2, method="sft"),
        event("started", "run-1", 2, method="sft"),
    ]  # no ETA, no history
    placed = place_and_eta(
        [waiting("a", "batch", 3), waiting("b", "batch", 2), waiting("c", "batch", 1)], events, settings, 2, NOW
    )
    assert [p.eta_s for p in placed] == [0.0, None, None]  # the free slot; then nothing says when any slot frees


def test_an_accepted_request_has_its_slot_is_listed_without_a_place_and_holds_the_slot_for_the_others(
    settings: Settings,
) -> None:
    read = [record(CLAIMS, 0, 3, sft_request("a1")), record(BATCH, 0, 2, sft_request("w1"))]
    events = [
        succeeded("old-1", 100, 0, model=sft_request("x")["model"]["id"]),
        event("accepted", "a1", 1, method="sft"),
    ]
    backlog = combine(read, events, settings)
    placed = {p.request.request_id: p for p in place_and_eta(backlog.waiting, events, settings, 1, NOW)}
    assert (placed["a1"].request.stage, placed["a1"].place, placed["a1"].eta_s) == ("accepted", None, 0.0)
    # One slot, a1's: w1 starts when a1 has run sft's 100 s (it was accepted a minute ago).
    assert placed["w1"].place == 1 and placed["w1"].eta_s == pytest.approx(40.0)


def test_the_fair_share_puts_the_team_that_has_had_less_slot_time_first(settings: Settings) -> None:
    heavy = [event("accepted", "big-1", 50, method="sft", team="search"), event("succeeded", "big-1", 10, method="sft")]
    queue = [
        WaitingRequest("s1", "batch", "search", NOW - timedelta(minutes=9), "sft", "m", 1, {}, "unread", "q[0]@0"),
        WaitingRequest("a1", "batch", "ads", NOW - timedelta(minutes=5), "sft", "m", 1, {}, "unread", "q[0]@1"),
    ]
    assert [p.request.request_id for p in place_and_eta(queue, heavy, settings, 1, NOW)] == ["a1", "s1"]
    assert [p.request.request_id for p in place_and_eta(queue, [], settings, 1, NOW)] == [
        "s1",
        "a1",
    ]  # no usage: arrival


def test_the_default_slots_are_the_hosts_that_started_a_job_in_the_last_day() -> None:
    events = [
        event("started", "a", 10, host="gpu-a", method="sft"),
        event("started", "b", 10, host="gpu-b", method="sft"),
        event("started", "c", 5, host="gpu-a", method="sft"),
        event("started", "d", 60 * 25, host="gpu-c", method="sft"),
    ]
    assert default_slots(events, NOW) == 2
    assert default_slots([], NOW) == 1


def test_the_default_slots_count_each_host_as_many_as_its_latest_accepted_event_says() -> None:
    events = [
        event("accepted", "a", 30, host="gpu-a", method="sft", host_slots=8),
        event("started", "a", 30, host="gpu-a", method="sft"),
        event("accepted", "b", 10, host="gpu-a", method="sft", host_slots=4),  # its latest: it was set to 4 since
        event("started", "c", 10, host="gpu-b", method="sft"),
    ]  # a host with no classes says none: one
    assert default_slots(events, NOW) == 5


def test_a_waiting_requests_eta_follows_its_own_max_steps(settings: Settings) -> None:
    # One slot, free; a finished sft job of 10 steps at 2 s a step and 10 s outside training: a request of 100 steps
    # waits behind one of 100 (210 s), not behind the median job's 30 s.
    done = [
        succeeded("old-1", 30, 0, metrics={"train_runtime": 20.0, "train_steps_per_second": 0.5, "median_step_s": 2.0})
    ]
    queue = [waiting("w1", "batch", 9, steps=100), waiting("w2", "batch", 5, steps=100)]
    placed = {p.request.request_id: p for p in place_and_eta(queue, done, settings, 1, NOW)}
    assert placed["w1"].eta_s == pytest.approx(0.0)
    assert placed["w2"].eta_s == pytest.approx(210.0)


def test_a_sweep_matches_waiting_and_running_requests_by_team_class_and_every_metadata_pair(settings: Settings) -> None:
    read = [
        record(BATCH, 0, 30, sft_request("s1", team="search", metadata={"sweep": "s1", "size": "7b"})),
        record(BATCH, 1, 29, sft_request("s2", team="search", metadata={"sweep": "s2"})),
        record(URGENT, 0, 5, sft_request("u1", priority_class="urgent", team="search", metadata={"sweep": "s1"})),
        record(CLAIMS, 0, 28, sft_request("r1", team="search", metadata={"sweep": "s1"})),
    ]
    events = [
        event("accepted", "r1", 27, method="sft", priority_class="batch", team="search"),
        event("started", "r1", 27, method="sft"),
        # running where no record is left to read (another host's claim, committed): its events say who it is
        event("accepted", "r2", 27, method="sft", priority_class="batch", team="ads", metadata={"sweep": "s1"}),
        event("started", "r2", 27, method="sft", metadata={"sweep": "s1"}),
    ]
    backlog = combine(read, events, settings)

    def matched(team: str | None = None, priority_class: str | None = None, *pairs: str) -> list[tuple[str, str]]:
        return [
            (m.request_id, m.state)
            for m in matches(backlog, selector(settings, team, priority_class, list(pairs)), settings)
        ]

    assert matched("search") == [("s1", "waiting"), ("s2", "waiting"), ("u1", "waiting"), ("r1", "running")]
    assert matched(None, "batch", "sweep=s1") == [("s1", "waiting"), ("r1", "running"), ("r2", "running")]
    assert matched(None, None, "sweep=s1", "size=7b") == [("s1", "waiting")]  # every pair must match
    assert matched("ads", "urgent") == []


@pytest.mark.parametrize(
    ("team", "priority_class", "pairs", "named"),
    [
        ("Search Team", None, [], "--team"),
        (None, "nope", [], "--class: unknown class 'nope'; one of urgent, batch"),
        (None, None, ["sweep"], "--selector: 'sweep' is not key=value"),
        (None, None, ["=x"], "--selector"),
        (None, None, ["a=1", "a=2"], "--selector: a given twice"),
        (None, None, [], "give a request id, or --team, --class or --selector"),
    ],
)
def test_a_sweep_that_can_match_nothing_by_its_form_is_refused_naming_the_option(
    settings: Settings, team: str | None, priority_class: str | None, pairs: list[str], named: str
) -> None:
    with pytest.raises(UsageError, match=named):
        selector(settings, team, priority_class, pairs)


def test_a_class_sweep_on_a_fleet_without_classes_says_there_are_none(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="this fleet has no priority classes"):
        selector(Settings(work_dir=tmp_path), None, "batch", [])


def test_a_request_held_by_its_teams_cap_is_told_when_its_teams_job_ends_not_now(settings: Settings) -> None:
    """Issue 57: a request held by its team's `max_slots` was told "place 1, ETA 0 s" by `get` and `jobs` (it started
    13 s later). Team t may hold one slot; its run-1 ends in 13 s; the fleet's second slot is free."""
    capped = settings.model_copy(update={"teams": Settings(teams={"t": {"max_slots": 1}}, **shared_fleet_keys()).teams})
    events = [
        succeeded("old-1", 100, 0),
        event("accepted", "run-1", 2, method="sft", team="t", priority_class="batch"),
        event("started", "run-1", 2, method="sft"),
        event("progress", "run-1", 0, step=5, total_steps=50, eta_s=13.0),
    ]
    placed = place_and_eta([waiting("held", "batch", 1)], events, capped, 2, NOW)
    assert [(p.request.request_id, p.place, p.eta_s) for p in placed] == [("held", 1, pytest.approx(13.0))]
    assert [p.eta_s for p in place_and_eta([waiting("held", "batch", 1)], events, settings, 2, NOW)] == [
        0.0
    ]  # no cap: the free slot


def test_a_held_or_paused_request_is_listed_waiting_held_and_counts_in_no_ones_place(settings: Settings) -> None:
    """Issue 63: a request whose latest event is `held` or `paused` starts nowhere until released: listed with that
    stage, placed nowhere, and the others' places do not count it; released, it is placed again."""
    read = [
        record(BATCH, 0, 9, sft_request("held-1")),
        record(BATCH, 1, 8, sft_request("paused-1")),
        record(BATCH, 2, 7, sft_request("b3")),
    ]
    events = [
        event("held", "held-1", 6, reason="review"),
        event("accepted", "paused-1", 20, method="sft"),
        event("paused", "paused-1", 5, reason="demo"),
    ]
    placed = {
        p.request.request_id: p
        for p in place_and_eta(combine(read, events, settings).waiting, events, settings, 1, NOW)
    }
    assert (placed["held-1"].request.stage, placed["held-1"].place) == ("held", None)
    assert (placed["paused-1"].request.stage, placed["paused-1"].place) == ("paused", None)
    assert (placed["b3"].place, placed["b3"].of) == (1, 1)
    events.append(event("released", "held-1", 1, reason="reviewed"))
    placed = {
        p.request.request_id: p
        for p in place_and_eta(combine(read, events, settings).waiting, events, settings, 1, NOW)
    }
    assert (placed["held-1"].place, placed["b3"].place) == (1, 2)


@pytest.mark.parametrize("big", [{"gpus": 3}, {"gpus": 2, "hosts": 2}], ids=["more-gpus", "two-hosts"])
def test_a_request_bigger_than_any_host_is_placed_in_order_with_no_eta_and_takes_no_slot_of_the_fleets(
    settings: Settings, big: dict[str, int]
) -> None:
    # Two hosts of two GPUs each, free again; a request of more GPUs than a host has, or across two hosts, first in the
    # order runs on a Ray cluster if anywhere.
    events = [
        event("accepted", "old-1", 60, host="host-a", method="sft", host_slots=2),
        event("succeeded", "old-1", 50, host="host-a"),
        event("accepted", "old-2", 60, host="host-b", method="sft", host_slots=2),
        event("succeeded", "old-2", 50, host="host-b"),
    ]
    smalls = [f"small-{i}" for i in range(1, 5)]
    read = [
        record(BATCH, 0, 5, sft_request("big", resources=big)),
        *(record(BATCH, 1 + i, 4 - i, sft_request(name)) for i, name in enumerate(smalls)),
    ]
    backlog = combine(read, events, settings)
    placed = {
        p.request.request_id: (p.place, p.eta_s) for p in place_and_eta(backlog.waiting, events, settings, 4, NOW)
    }
    # The four small ones start now, two on each host (had the big one taken slots, some would wait a job's length).
    assert placed == {**{name: (i, 0.0) for i, name in enumerate(smalls, 1)}, "big": (5, None)}
