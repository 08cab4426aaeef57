"""Requests that wait for others (`after`, daemon/jobs/prerequisites.py) on the in-memory fakes (tests/core.py), the
fleet's answers about each prerequisite given by the test (`lookup`) and time by its clock: a dependant waits
without blocking what is behind it and says what it waits for, starts from its prerequisite's published artifact
once that succeeded, ends failed when one failed, and is rejected naming `after` when an id stays unheard of."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from daemon.jobs.offered import Offered
from daemon.jobs.prerequisites import Known
from daemon.settings import Settings
from handlers.protocol import StartPoint
from schemas import Succeeded
from tests.core import CoreOnFakes, turns_until
from tests.fakes import FakeChildren, Script
from tests.helpers import TRAIN_RESULT as RESULT
from tests.helpers import sft_request

SHA = "c" * 40


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None)


class Fleet:
    """What the fleet says of each request id (absent: never heard of), and a clock the test moves."""

    def __init__(self) -> None:
        self.known: dict[str, Known] = {}
        self.now = 1_000.0
        self.asked: list[str] = []

    async def lookup(self, request_id: str) -> Known:
        self.asked.append(request_id)
        return self.known.get(request_id, Known(None))

    def succeeded(self, request_id: str, published: str = "main", location: str | None = None) -> None:
        local = location is not None  # published by the local sink, its event naming `location` as its folder
        event = Succeeded(
            request_id=request_id,
            host="h",
            attempt=1,
            sink="local" if local else "hub",
            repo_id=f"results/{request_id}",
            revision="main",
            commit_sha=None if local else SHA,
            commit_url=None,
            location=location or f"https://hub/results/{request_id}",
            published=published,  # type: ignore[arg-type]
            trainer="t",
            metrics={},
            base_model="m",
            base_model_revision=None,
            dataset_fingerprint="f",
            durations_s={},
            versions={},
            method="sft",
            files=[],
        )
        self.known[request_id] = Known("succeeded", "published", event)


def dependant(request_id: str = "dpo-1", after: list[str] | None = None, start_from: str | None = "sft-1") -> dict:
    return sft_request(request_id, after=after if after is not None else ["sft-1"], start_from=start_from)


def core_on(settings: Settings, fleet: Fleet, children: FakeChildren | None = None) -> CoreOnFakes:
    core = CoreOnFakes(settings, children=children or FakeChildren(Script(messages=[RESULT])))
    prerequisites = core.scheduler.prerequisites
    prerequisites.lookup, prerequisites.clock, prerequisites.recheck_s = fleet.lookup, lambda: fleet.now, 5.0
    prerequisites.unknown_wait_s = 60.0
    return core


async def test_a_dependant_waits_alone_says_for_what_and_starts_from_the_published_adapter(
    settings: Settings,
) -> None:
    fleet = Fleet()
    fleet.known["sft-1"] = Known("running", "train step 2/4")
    children = FakeChildren(Script(messages=[RESULT]))
    core = core_on(settings, fleet, children)
    record = core.record(dependant(), 7)

    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.WAITING
    assert core.consumer.sought[core.tp] == 7 and core.tp in core.consumer.paused and core.scheduler.holds(core.tp)
    assert children.taken == [] and core.consumer.commits == [] and core.slots.busy == 0
    [waiting] = core.events("dpo-1")
    assert (waiting["type"], waiting["after"]) == ("waiting", ["sft-1"])

    core.scheduler.wake()  # not yet time to look again
    assert core.tp in core.consumer.paused
    fleet.now += 5
    core.scheduler.wake()  # read again, asked again
    assert core.tp not in core.consumer.paused and not core.scheduler.holds(core.tp)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.WAITING
    assert core.types("dpo-1") == ["waiting"]  # told once for the same set

    fleet.succeeded("sft-1")
    fleet.now += 5
    core.scheduler.wake()
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    await turns_until(lambda: "succeeded" in core.types("dpo-1"))
    assert children.taken[0].spec.start == StartPoint(
        request_id="sft-1", repo_id="results/sft-1", commit_sha=SHA, folder=None
    )
    assert fleet.asked == ["sft-1"] * 3


async def test_a_start_published_by_the_local_sink_is_its_folder_of_that_repo_never_a_path_the_event_names(
    settings: Settings,
) -> None:
    """A writer of the events topic could name any folder of the host in a `succeeded` event's `location`: the start is
    the local sink's own folder of the event's repo, under the operator's work_dir."""
    fleet = Fleet()
    fleet.succeeded("sft-1", location="/etc")
    children = FakeChildren(Script(messages=[RESULT]))
    core = core_on(settings, fleet, children)
    record = core.record(dependant(), 7)

    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    await turns_until(lambda: bool(children.taken))
    assert children.taken[0].spec.start == StartPoint(
        request_id="sft-1",
        repo_id="results/sft-1",
        commit_sha=None,
        folder=settings.outputs_dir.resolve() / "results/sft-1",
    )


async def test_a_dependant_with_requests_behind_it_goes_behind_them_at_most_once_a_recheck(settings: Settings) -> None:
    fleet = Fleet()
    fleet.known["sft-1"] = Known("queued", "")
    core = core_on(settings, fleet)
    core.consumer.ends[core.tp] = 9  # requests stand behind it
    record = core.record(dependant(), 7)

    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.DEFERRED
    [again] = core.requeued()
    assert again.value == record.value and core.consumer.commits == [(core.tp, 8)]
    # Read again at once (behind another waiting request, say): it does not pass it again until a recheck is due.
    copy = core.record(dependant(), 9)
    core.consumer.ends[core.tp] = 11
    assert await core.scheduler.offer(core.tp, copy, core.request(copy)) is Offered.WAITING
    assert len(core.requeued()) == 1
    fleet.now += 5
    core.scheduler.wake()
    assert await core.scheduler.offer(core.tp, copy, core.request(copy)) is Offered.DEFERRED


@pytest.mark.parametrize(
    ("state", "detail"), [("failed", "training_error in train: boom"), ("cancelled", "no longer wanted")]
)
async def test_a_failed_or_cancelled_prerequisite_ends_the_dependant_failed_naming_it(
    settings: Settings, state: str, detail: str
) -> None:
    fleet = Fleet()
    fleet.succeeded("data-prep")
    fleet.known["sft-1"] = Known(state, detail)
    children = FakeChildren(Script(messages=[RESULT]))
    core = core_on(settings, fleet, children)
    record = core.record(dependant(after=["data-prep", "sft-1"]), 7)

    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.SKIPPED
    [failed] = core.events("dpo-1")
    assert (failed["type"], failed["code"], failed["stage"], failed["retryable"]) == (
        "failed",
        "prerequisite_failed",
        "intake",
        False,
    )
    assert failed["message"] == f"after: sft-1 {state}: {detail}"
    assert core.consumer.commits == [(core.tp, 8)] and children.taken == []


async def test_a_start_whose_gate_failed_leaves_nothing_to_start_from(settings: Settings) -> None:
    fleet = Fleet()
    fleet.succeeded("sft-1", published="pr")
    core = core_on(settings, fleet)
    record = core.record(dependant(), 7)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.SKIPPED
    [failed] = core.events("dpo-1")
    assert failed["code"] == "prerequisite_failed" and failed["message"].startswith("start_from: sft-1 succeeded")


async def test_two_requests_naming_each_other_end_failed_as_a_cycle(settings: Settings) -> None:
    fleet = Fleet()
    core = core_on(settings, fleet)
    first = core.record(dependant("a", after=["b"], start_from=None), 7)
    assert await core.scheduler.offer(core.tp, first, core.request(first)) is Offered.WAITING  # b unheard of yet
    fleet.known["a"] = Known("queued", "waits for b", waits_for=("b",))  # a's `waiting`, as the table folds it
    core.scheduler.let_go(core.tp, 7)
    second = core.record(dependant("b", after=["a"], start_from=None), 8)
    assert await core.scheduler.offer(core.tp, second, core.request(second)) is Offered.SKIPPED
    [failed] = core.events("b")
    assert failed["code"] == "prerequisite_failed" and "a cycle" in failed["message"]


async def test_a_ring_of_three_waiting_for_each_other_ends_failed_naming_the_ring(settings: Settings) -> None:
    fleet = Fleet()
    core = core_on(settings, fleet)
    # a waits for b and b for c, each told in its `waiting` event as the table folds it; c, reached last, names a.
    fleet.known["a"] = Known("queued", "waits for b", waits_for=("b",))
    fleet.known["b"] = Known("queued", "waits for c", waits_for=("c",))
    last = core.record(dependant("c", after=["a"], start_from=None), 8)
    assert await core.scheduler.offer(core.tp, last, core.request(last)) is Offered.SKIPPED
    [failed] = core.events("c")
    assert failed["code"] == "prerequisite_failed"
    assert failed["message"] == "after: c waits for a waits for b waits for c: a cycle, none of them can start"
    assert fleet.asked == ["a", "b"]  # b looked up through a's waits; c is the request itself


async def test_an_id_unheard_of_past_the_bound_is_rejected_naming_after(settings: Settings) -> None:
    fleet = Fleet()
    children = FakeChildren(Script(messages=[RESULT]))
    core = core_on(settings, fleet, children)
    record = core.record(dependant(after=["sft-typo"], start_from=None), 0)

    await core.intake.take(core.tp, [record])  # published at once with its prerequisite: waited for
    assert core.types("dpo-1") == ["waiting"]
    fleet.now += 60
    core.scheduler.wake()
    await core.intake.take(core.tp, [record])
    rejected = core.events("dpo-1")[-1]
    assert rejected["type"] == "rejected" and rejected["errors"][0]["path"] == "after"
    assert "sft-typo: no such request known to the fleet" in rejected["errors"][0]["message"]
    assert children.taken == [] and [letter.key for letter in core.dead_letters()] == [b"dpo-1"]


async def test_a_request_without_after_asks_the_fleet_nothing(settings: Settings) -> None:
    fleet = Fleet()
    core = core_on(settings, fleet)
    record = core.record(sft_request("plain"), 0)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    assert fleet.asked == [] and time.time() > 0


async def test_with_priority_classes_a_request_whose_prerequisite_runs_is_not_claimed_and_holds_up_none(
    tmp_path: Path,
) -> None:
    from schemas import parse_event
    from schemas.signing import new_key_pair
    from tests.daemon.core.test_fleet_core import claims, host, submit, turns

    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    retry_key = tmp_path / "retry-key"
    retry_key.write_bytes(b"the fleet's one retry key, long enough")
    settings = Settings(
        event_signing_key_file=key,
        retry_key_file=retry_key,
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        host="this-host",
        claims_topic="adapterd.claims",
        default_priority_class="default",
        priority_classes=[{"name": "default"}],
        queue_wait_event_s=0.0,
        job_slots=2,
    )
    core, dispatcher = host(settings, claims_partitions=2)

    def started(request_id: str, kind: str) -> None:  # an event of another host, as the view folds it
        fields = {"type": kind, "request_id": request_id, "host": "elsewhere", "attempt": 1, "schema_version": 1}
        extra = {"started": {"slot": 0, "method": "sft", "pid": 1}, "accepted": {"method": "sft"}}.get(kind, {})
        dispatcher.view.observe(parse_event(json.dumps({**fields, **extra}).encode()), time.time())  # type: ignore[arg-type]

    started("sft-1", "accepted")
    body = dependant()
    core.fleet.produce(settings.class_topics["default"], b"dpo-1", json.dumps(body).encode(), timestamp=1)
    submit(core, "plain-after", "default", at_ms=2)
    await turns(dispatcher)
    assert claims(core) == [b"plain-after"]  # the one behind it is claimed; it is not

    fleet_done = Fleet()
    fleet_done.succeeded("sft-1")
    done = fleet_done.known["sft-1"].succeeded
    assert done is not None
    dispatcher.view.observe(done, time.time())
    await turns(dispatcher)
    assert claims(core) == [b"plain-after", b"dpo-1"]


def test_jobs_and_get_say_what_a_waiting_request_waits_for() -> None:
    from daemon.cli.console import describe
    from daemon.cli.jobs import document
    from daemon.table.entry import folded
    from schemas import parse_event

    waiting = parse_event(
        json.dumps(
            {
                "schema_version": 1,
                "type": "waiting",
                "request_id": "dpo-1",
                "host": "h",
                "attempt": 1,
                "after": ["a", "b"],
            }
        ).encode()
    )
    entry = folded(None, waiting)  # type: ignore[arg-type]
    assert entry is not None
    said = document(entry)  # `adapterd jobs --json` (and `get --json`)
    assert (said["state"], said["latest"], said["detail"]) == ("queued", "waiting", "waits for a, b")
    assert describe(waiting).endswith("dpo-1 waiting on h: waits for a, b")  # type: ignore[arg-type]


async def test_a_table_that_cannot_be_read_leaves_the_dependant_waiting_not_ended(settings: Settings) -> None:
    fleet = Fleet()
    core = core_on(settings, fleet)

    async def away(request_id: str) -> Known:
        raise ConnectionError("the brokers are away")

    core.scheduler.prerequisites.lookup = away
    record = core.record(dependant(), 7)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.WAITING
    assert core.events() == [] and core.consumer.commits == [] and core.scheduler.holds(core.tp)


def test_a_waiting_records_listing_names_its_after(tmp_path: Path) -> None:
    from daemon.cli.places import Placed
    from daemon.cli.waiting import Queue, from_record
    from testbed.memory_kafka import FakeRecord

    settings = Settings(work_dir=tmp_path)
    queue = Queue(settings.group_id, settings.requests_topic, "unread", None)
    value = json.dumps(dependant(after=["data-1", "sft-1"])).encode()
    waiting = from_record(queue, FakeRecord(queue.topic, 0, 3, b"dpo-1", value, [], 1_000), settings)
    assert waiting.after == ["data-1", "sft-1"] and "after data-1, sft-1" in waiting.detail
    said = Placed(waiting, None, None).document()  # `adapterd jobs --state queued --json`
    assert said["after"] == ["data-1", "sft-1"]
