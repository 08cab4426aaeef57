"""The fleet's view made from the table of requests and the tail of the events (daemon/fleet/view.py `Folds.load`,
`Folds.tail`) says for the decisions what folding every event of the window says: the teams' slot-time, the running
jobs, the expected durations, the hosts' slots, what each waiting request was told and a preemption's switch. Pure:
histories of events folded into table entries by daemon/table/entry.py `folded` as the keepers fold them, cut where
the keepers' committed offsets would be."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from daemon.fleet.view import USAGE_LOOKBACK_S, Folds
from daemon.kafka.event_ids import EventIds
from daemon.table.entry import EARLIER_RUNS, TableEntry, folded
from daemon.table.reader import recent_events
from schemas import (
    Accepted,
    Checkpoint,
    Event,
    Preempted,
    Progress,
    Queued,
    Retrying,
    Started,
    parse_event,
)
from schemas.events import EventBase
from tests.helpers import local_success

NOW = time.time()


def at(seconds_ago: float) -> datetime:
    return datetime.fromtimestamp(NOW - seconds_ago, UTC)


def read(event: EventBase) -> Event:
    return parse_event(event.model_dump_json().encode())


def accepted(request_id: str, host: str, ago: float, **fields: Any) -> Event:
    defaults: dict[str, Any] = {"method": "sft", "priority_class": "batch", "team": "vision", "model": "tiny/m"}
    return read(Accepted(request_id=request_id, host=host, time=at(ago), **{**defaults, **fields}))


def started(request_id: str, host: str, ago: float, slot: str = "0", **fields: Any) -> Event:
    return read(Started(request_id=request_id, host=host, method="sft", pid=1, slot=slot, time=at(ago), **fields))


def progress(request_id: str, host: str, ago: float, step: int, eta_s: float | None = None) -> Event:
    return read(Progress(request_id=request_id, host=host, step=step, total_steps=100, eta_s=eta_s, time=at(ago)))


def checkpoint(request_id: str, host: str, ago: float, step: int) -> Event:
    return read(Checkpoint(request_id=request_id, host=host, step=step, path=f"/j/checkpoint-{step}", time=at(ago)))


def succeeded(request_id: str, host: str, ago: float, total: float, method: str = "sft", **fields: Any) -> Event:
    return read(
        local_success(
            request_id,
            host=host,
            time=at(ago),
            metrics={"train_runtime": total / 2, "train_steps_per_second": 0.5},
            durations_s={"queue": 5.0, "total": total},
            method=method,
            base_model="tiny/m",
            **fields,
        )
    )


def queued(request_id: str, host: str, ago: float, place: int, eta_s: float | None) -> Event:
    return read(
        Queued(
            request_id=request_id,
            host=host,
            priority_class="batch",
            team="text",
            place=place,
            eta_s=eta_s,
            time=at(ago),
        )
    )


def retrying(request_id: str, host: str, ago: float, attempt: int) -> Event:
    return read(
        Retrying(
            request_id=request_id,
            host=host,
            attempt=attempt,
            code="oom",
            message="out of memory",
            stage="train",
            max_attempts=9,
            time=at(ago),
        )
    )


def preempted(request_id: str, host: str, ago: float, by: str, count: int) -> Event:
    return read(
        Preempted(request_id=request_id, host=host, by=by, priority_class="batch", preemptions=count, time=at(ago))
    )


# Jobs on two hosts with progress and checkpoints; a job preempted (its first run before the window) and resumed on
# the other host, its preemption carried; finished jobs (durations); waiting requests told `queued`,
# by two hosts, one of them since accepted; a job whose `accepted` is older than the window.
def history() -> list[Event]:
    """The history, its events of ids of their own at each call (a real-broker test's are its own)."""
    return [
        accepted("old", "gpu-b", USAGE_LOOKBACK_S + 600),
        accepted("pre", "gpu-a", USAGE_LOOKBACK_S + 500, host_slots=4),
        started("pre", "gpu-a", USAGE_LOOKBACK_S + 490, slot="0,1"),
        started("old", "gpu-b", USAGE_LOOKBACK_S + 400),
        checkpoint("pre", "gpu-a", 3300, 40),
        accepted("f1", "gpu-b", 3200, host_slots=2, max_steps=50),
        started("f1", "gpu-b", 3190),
        preempted("pre", "gpu-a", 3100, by="urgent-1", count=1),
        accepted("urgent-1", "gpu-a", 3095, priority_class="urgent", team="text", host_slots=4),
        started("urgent-1", "gpu-a", 3090, slot="0,1"),
        progress("f1", "gpu-b", 3000, 10),
        progress("f1", "gpu-b", 2900, 30, eta_s=120.0),
        succeeded("f1", "gpu-b", 2700, 500.0),
        queued("w1", "gpu-a", 2600, 3, None),
        queued("w2", "gpu-b", 2590, 2, 900.0),
        accepted("pre", "gpu-b", 2500, host_slots=2),
        started("pre", "gpu-b", 2490, slot="0", resumed_step=40),
        queued("w1", "gpu-b", 2400, 2, 600.0),
        accepted("f2", "gpu-a", 2300, method="dpo", max_steps=20),
        started("f2", "gpu-a", 2290, slot="2,3"),
        succeeded("f2", "gpu-a", 1900, 380.0, method="dpo"),
        progress("pre", "gpu-b", 1700, 50, eta_s=500.0),
        progress("old", "gpu-b", 1650, 70, eta_s=100.0),
        accepted("r1", "gpu-a", 1600, max_steps=100),
        started("r1", "gpu-a", 1590, slot="2,3"),
        progress("r1", "gpu-a", 1500, 10),
        queued("w3", "gpu-a", 1450, 1, 60.0),
        progress("r1", "gpu-a", 1400, 20, eta_s=800.0),
        checkpoint("r1", "gpu-a", 1390, 20),
        checkpoint("pre", "gpu-b", 1300, 60),
        accepted("w3", "gpu-b", 1200),
        started("w3", "gpu-b", 1190),
        progress("r1", "gpu-a", 1000, 30, eta_s=700.0),
        progress("pre", "gpu-b", 900, 65, eta_s=350.0),
        queued("w2", "gpu-a", 800, 1, 300.0),
        progress("w3", "gpu-b", 600, 5, eta_s=90.0),
        succeeded("w3", "gpu-b", 500, 700.0),
        progress("r1", "gpu-a", 100, 40, eta_s=600.0),
    ]


HISTORY = history()


def placed(history: list[Event]) -> list[tuple[Event, int, int]]:
    """Each event with the partition and offset it would have: a request's events in one of two partitions."""
    partitions = {rid: n % 2 for n, rid in enumerate(dict.fromkeys(e.request_id for e in history))}
    offsets = [0, 0]
    out = []
    for event in history:
        partition = partitions[event.request_id]
        out.append((event, partition, offsets[partition]))
        offsets[partition] += 1
    return out


def table(events: list[tuple[Event, int, int]]) -> list[TableEntry]:
    """The entries the keepers write for these events (daemon/table/entry.py `folded`)."""
    entries: dict[str, TableEntry] = {}
    for event, partition, offset in events:
        rid = event.request_id or ""
        entries[rid] = folded(entries.get(rid), event, partition, offset) or entries[rid]
    return list(entries.values())


def every_event(history: list[Event]) -> Folds:
    """The view folded from every event of the history, as the events topic's reader gives them."""
    folds, ids = Folds(), EventIds(USAGE_LOOKBACK_S)
    for event in history:
        if ids.refused(event, NOW) is None:
            folds.observe(event, NOW)
    return folds


def from_table(history: list[Event], committed: int, written: int | None = None) -> Folds:
    """The view made from the entries of the events before `committed` (or `written`: the keepers wrote entries
    past their committed offsets before a crash), then the events from `committed` on."""
    events = placed(history)
    folds = Folds()
    folds.load(table(events[: committed if written is None else written]), NOW)
    for event, partition, offset in events[committed:]:
        folds.tail(event, partition, offset, NOW)
    return folds


def decisions(folds: Folds) -> dict[str, object]:
    """What the decisions read of the view (all but the slot-seconds, compared approximately)."""
    methods = [("sft", "tiny/m", None), ("sft", "tiny/m", 80), ("dpo", "tiny/m", None), ("kto", "x", 10)]
    return {
        "running": folds.usage.running(),
        "jobs": sorted(folds.running_jobs.jobs(NOW), key=lambda job: job.request_id),
        "expected": [folds.durations.expected(*each) for each in methods],
        "host_slots": folds.host_slots,
        "told": folds.telling.told,
        "switch": folds.switches.seconds(),
    }


@pytest.mark.parametrize("committed", [0, 7, 20, 33, len(HISTORY)])
def test_the_view_from_the_table_and_the_tail_is_the_view_from_every_event(committed: int) -> None:
    whole, made = every_event(HISTORY), from_table(HISTORY, committed)
    assert decisions(made) == decisions(whole)
    assert made.usage.slot_seconds(NOW) == pytest.approx(whole.usage.slot_seconds(NOW), rel=1e-9)
    # What the history says, so that an empty view would not pass: the jobs on both hosts, at their last progress
    # and checkpoint; the preempted job back with its count; the durations; the waiting requests' latest tellings.
    jobs = {job.request_id: job for job in made.running_jobs.jobs(NOW)}
    assert sorted(jobs) == ["pre", "r1", "urgent-1"]  # "old" was accepted before the window: not counted
    assert (jobs["r1"].host, jobs["r1"].gpus, jobs["r1"].steps_since_checkpoint, jobs["r1"].steps_left) == (
        "gpu-a",
        2,
        20,
        60,
    )
    assert (jobs["pre"].host, jobs["pre"].preemptions, jobs["pre"].steps_since_checkpoint) == ("gpu-b", 1, 5)
    assert made.usage.running() == {"vision": 3, "text": 2}
    assert made.durations.expected("sft", "tiny/m") == pytest.approx(sorted([495.0, 695.0])[0] / 2 + 695.0 / 2)
    assert made.durations.expected("dpo", "tiny/m") == pytest.approx(375.0)
    assert made.host_slots == {"gpu-a": 4, "gpu-b": 2}
    assert {rid: (told.place, told.eta_s, told.host) for rid, told in made.telling.told.items()} == {
        "w1": (2, 600.0, "gpu-b"),
        "w2": (1, 300.0, "gpu-a"),
    }
    assert made.switches.seconds() == pytest.approx(10.0)


@pytest.mark.parametrize(("committed", "written"), [(0, 25), (20, 33), (33, len(HISTORY))])
def test_entries_written_past_the_keepers_committed_offsets_are_not_folded_twice(committed: int, written: int) -> None:
    """A keeper that wrote entries and died before it committed the events' offsets: the tail read from the committed
    offsets holds events the entries hold already (some of them replaced in `recent` by later ones, which folded again
    would put a job back at an earlier step). Each is folded once, in its order."""
    whole, made = every_event(HISTORY), from_table(HISTORY, committed, written)
    assert decisions(made) == decisions(whole)
    assert made.usage.slot_seconds(NOW) == pytest.approx(whole.usage.slot_seconds(NOW), rel=1e-9)
    assert made.skipped["tabled"] > 0


def test_a_request_that_ran_twice_within_the_window_counts_both_runs() -> None:
    """An entry keeps its earlier runs' `accepted`, `started` and end beside its latest events, so of a request
    preempted and run again within the window both runs' slot-time counts, as every event says; and its preemption
    count, the switch and the running jobs too. Of a request run more often than the entry keeps runs, the oldest
    runs' slot-time is what is left out."""
    history = [
        accepted("twice", "gpu-a", 3000, host_slots=4),
        started("twice", "gpu-a", 2990, slot="0,1"),
        preempted("twice", "gpu-a", 2000, by="u", count=1),
        accepted("u", "gpu-a", 1995, priority_class="urgent", team="text", host_slots=4),
        started("u", "gpu-a", 1990),
        accepted("twice", "gpu-b", 1000, host_slots=2),
        started("twice", "gpu-b", 990, slot="0", resumed_step=10),
    ]
    whole, made = every_event(history), from_table(history, len(history))
    assert decisions(made) == decisions(whole)
    assert sorted((job.request_id, job.preemptions) for job in made.running_jobs.jobs(NOW)) == [("twice", 1), ("u", 0)]
    assert made.usage.slot_seconds(NOW) == pytest.approx(whole.usage.slot_seconds(NOW), rel=1e-9)
    # Run four times (three retries on gpu-c): the entry keeps the latest run and the EARLIER_RUNS before it.
    runs = [
        event
        for n, ago in enumerate((3500, 3000, 2500, 2000))
        for event in (
            accepted("often", "gpu-c", ago, attempt=n + 1, host_slots=1),
            started("often", "gpu-c", ago - 10, slot="0"),
            retrying("often", "gpu-c", ago - 100, attempt=n + 1),
        )
    ]
    made = from_table(runs, len(runs))
    kept = every_event(runs[3 * (4 - 1 - EARLIER_RUNS) :])
    assert made.usage.slot_seconds(NOW) == pytest.approx(kept.usage.slot_seconds(NOW), rel=1e-9)
    assert made.usage.slot_seconds(NOW)["vision"] < every_event(runs).usage.slot_seconds(NOW)["vision"]


def test_a_success_answered_again_to_a_redelivery_keeps_the_first_in_the_durations_and_ends_its_run() -> None:
    """A request redelivered after its success is accepted again (its entry's state starts afresh) and answered from
    the success (`duplicate`, trained nothing): the entry keeps the first success beside the duplicate, so the
    durations have the first as every event's fold has it, and the second run ends (no slot held for ever)."""
    history = [
        accepted("f2", "gpu-a", 2300, method="dpo", host_slots=4),
        started("f2", "gpu-a", 2290, slot="2,3"),
        succeeded("f2", "gpu-a", 1900, 380.0, method="dpo"),
        accepted("f2", "gpu-a", 1800, method="dpo", host_slots=4),
        succeeded("f2", "gpu-a", 1795, 1.0, method="dpo", duplicate=True),
    ]
    whole, made = every_event(history), from_table(history, len(history))
    assert whole.durations.expected("dpo", "tiny/m") == pytest.approx(375.0)
    assert made.durations.expected("dpo", "tiny/m") == pytest.approx(375.0)
    assert made.running_jobs.jobs(NOW) == [] and made.usage.running() == {}
    assert made.usage.slot_seconds(NOW) == pytest.approx(whole.usage.slot_seconds(NOW), rel=1e-9)  # both runs


def test_a_repeated_event_in_the_tail_and_events_before_the_window_are_not_folded() -> None:
    history = HISTORY[:20]
    events = placed(history)
    folds = Folds()
    folds.load(table(events), NOW)
    event, partition, _ = events[-1]
    assert folds.tail(event, partition, 10_000, NOW) == "repeated"  # the same event written again, further on
    assert folds.skipped == {"repeated": 1}  # the table's events older than the window are left out, not counted
    assert decisions(folds) == decisions(every_event(history))


def test_an_event_whose_time_has_no_zone_is_merged_with_the_others() -> None:
    """A genuine event's time may be written without a zone (the schema takes it): the entries are merged by their
    times as numbers, never failing the whole load on a comparison of the two kinds."""
    naive = read(
        Started(request_id="r1", host="gpu-a", method="sft", pid=1, slot="0", time=at(100).replace(tzinfo=None))
    )
    entries = table(placed([accepted("r1", "gpu-a", 200), naive, accepted("r2", "gpu-b", 150)]))
    folds = Folds()
    folds.load(entries, NOW)
    assert sorted(job.request_id for job in folds.running_jobs.jobs(NOW)) == ["r1", "r2"]
    # The commands' fleet order (`adapterd jobs --state queued`) takes the same events from the table's reader.
    assert [event.type for event in recent_events(entries)] == ["accepted", "accepted", "started"]


def test_an_entry_keeps_of_a_success_what_the_fleets_pace_reads_and_no_more() -> None:
    """Issue 59: a success's files, versions, evaluation and metrics were two thirds of an entry's bytes, read by no
    fold of the fleet. Kept without them, it paces the fleet's expected durations as the whole one does."""
    from daemon.fleet.policy.usage import Durations
    from daemon.table.entry import KEPT_METRICS, folded
    from tests.daemon.fleet.test_fleet_usage import succeeded

    metrics = {"train_runtime": 40.0, "train_steps_per_second": 0.5, "median_step_s": 1.8, "train_loss": 0.3}
    metrics |= {f"rank{n}_peak_bytes": 1e9 for n in range(8)}
    whole = succeeded("paced", 100.0, {"total": 60.0, "queue": 5.0, "push": 3.0}, metrics=metrics)
    whole = whole.model_copy(update={"files": ["adapter_model.safetensors"] * 50, "versions": {"trl": "1"}})
    entry = folded(None, whole)
    assert entry is not None
    (kept,) = entry.recent
    assert kept.metrics == {name: metrics[name] for name in KEPT_METRICS} and not kept.files and not kept.versions
    assert len(kept.model_dump_json()) < len(whole.model_dump_json()) / 2
    paced = [Durations(), Durations()]
    for durations, event in zip(paced, (whole, kept), strict=True):
        durations.observe(event, 0.0)
    assert paced[0].expected("sft", "tiny/m", 30) == paced[1].expected("sft", "tiny/m", 30) is not None
    assert paced[0].step_s("sft", "tiny/m") == paced[1].step_s("sft", "tiny/m") == 1.8
