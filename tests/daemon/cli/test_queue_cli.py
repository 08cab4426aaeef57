"""`adapterd jobs --state queued`, `adapterd get` and the sweep of `adapterd cancel` against a real
broker: requests written to the class topics and the claims topic as producers and dispatchers write
them, the queue groups' offsets committed as a dispatcher commits them, events published as daemons
publish them; the CLI finds each waiting request, its place and where it waits, without joining a group."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.kafka.options import kafka_options
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.fleet import PriorityClass
from daemon.settings.secret_files import event_signer
from schemas import parse_event
from schemas.signing import SIGNATURE_HEADER
from testbed.fleet_keys import shared_fleet_keys
from testbed.processes import settings_environment
from tests.helpers import event_document, sft_request

runner = CliRunner()
NOW = datetime.now(UTC)  # each test's own start (`now`): its records' and events' times count back from it


@pytest.fixture(autouse=True)
def now() -> None:
    """The clock the stamps count back from, read as each test starts: the CLI counts from its own clock, and under
    xdist a module imported at collection runs minutes later (its ETAs came out short)."""
    global NOW
    NOW = datetime.now(UTC)


@pytest.fixture
def fleet(settings: Settings) -> Iterator[Settings]:
    """The test's settings with two classes (batch, the lowest, is the default: its queue is the
    requests topic), a claims topic of its own, and those topics created."""
    fleet = settings.model_copy(
        update={
            "priority_classes": [PriorityClass(name="urgent"), PriorityClass(name="batch", preemptible=True)],
            "claims_topic": f"claims-{settings.group_id}",
            **shared_fleet_keys(),
        }
    )
    asyncio.run(create_topics(fleet, [fleet.class_topics["urgent"], fleet.claims_topic]))
    yield fleet


async def create_topics(settings: Settings, names: list[str]) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, 1, 1) for name in names])
    finally:
        await admin.close()


def write(
    settings: Settings,
    topic: str,
    *items: dict[str, Any] | bytes,
    minutes_ago: float = 0,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    """Requests (or raw bytes) to a topic, keyed by their id, stamped `minutes_ago`."""

    async def send() -> None:
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
        await producer.start()
        try:
            signer = (
                event_signer(settings) if topic == settings.events_topic else None
            )  # as the fleet's hosts sign theirs
            for item in items:
                value, key = (
                    (item, b"junk-1")
                    if isinstance(item, bytes)
                    else (json.dumps(item).encode(), item["request_id"].encode())
                )
                stamp = int((NOW - timedelta(minutes=minutes_ago)).timestamp() * 1000)
                signed = [(SIGNATURE_HEADER, signer.sign(value))] if signer is not None else []
                await producer.send_and_wait(
                    topic, value, key=key, timestamp_ms=stamp, headers=[*(headers or []), *signed] or None
                )
        finally:
            await producer.stop()

    asyncio.run(send())


def publish(settings: Settings, *events: tuple[str, str, float, dict[str, Any]]) -> None:
    """(kind, request id, minutes ago, fields) as daemons publish them: docs/events.md's examples, each with an
    event_id of its own (the examples share theirs, and a reader takes an id once)."""
    write(
        settings,
        settings.events_topic,
        *[event(kind, request_id, ago, **fields) for kind, request_id, ago, fields in events],
    )


def event(kind: str, request_id: str, ago: float, **fields: Any) -> dict[str, Any]:
    """One event as `publish` sends it."""
    fields = {"event_id": secrets.token_hex(16), **fields}
    return json.loads(
        parse_event(
            json.dumps(
                event_document(
                    kind,
                    request_id=request_id,
                    host=fields.pop("host", "gpu-a"),
                    time=(NOW - timedelta(minutes=ago)).isoformat(),
                    **fields,
                )
            ).encode()
        ).model_dump_json()
    )


def commit(settings: Settings, group: str, topic: str, offset: int) -> None:
    """What a dispatcher (or the daemon) commits: the group has read the partition up to `offset`."""

    async def send() -> None:
        consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=group, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition(topic, 0)])
            await consumer.commit({TopicPartition(topic, 0): offset})
        finally:
            await consumer.stop()

    asyncio.run(send())


def cli(settings: Settings, *args: str) -> tuple[int, list[str]]:
    result = runner.invoke(app, list(args), env=settings_environment(settings))
    return result.exit_code, result.output.splitlines()


def rows(lines: list[str]) -> dict[str, list[str]]:
    return {line.split()[0]: line.split() for line in lines[1:] if line.strip()}


def control_records(settings: Settings) -> list[tuple[bytes, dict[str, Any]]]:
    async def read() -> list[tuple[bytes, dict[str, Any]]]:
        async with TopicReader(settings, settings.control_topic) as reader:
            return [
                (record.key or b"", json.loads(record.value or b"")) async for record in reader.records(follow=False)
            ]

    return asyncio.run(read())


def test_every_waiting_request_unread_claimed_or_held_is_listed_in_the_fleets_order_and_get_answers_for_it(
    fleet: Settings,
) -> None:
    batch, urgent = fleet.class_topics["batch"], fleet.class_topics["urgent"]
    assert batch == fleet.requests_topic  # the default class's queue
    # b0 was read by a dispatcher and moved to the claims topic with its arrival time (its queue offset
    # committed past it); b1 and b2 still wait unread behind it. u1 arrives last, in the higher class.
    write(fleet, batch, *[sft_request(f"b{n}", team="search") for n in range(3)], minutes_ago=30)
    commit(fleet, f"{fleet.group_id}.queue.batch", batch, 1)
    write(fleet, fleet.claims_topic, sft_request("b0", team="search"), minutes_ago=30)
    write(fleet, fleet.claims_topic, sft_request("run-1", team="ads"), minutes_ago=20)
    write(fleet, urgent, sft_request("u1", priority_class="urgent", team="fixes"), b"{not a request", minutes_ago=1)
    publish(
        fleet,
        ("accepted", "run-1", 19, {"method": "sft", "host": "gpu-b"}),
        ("started", "run-1", 19, {"method": "sft", "host": "gpu-b"}),
        (
            "queued",
            "held-1",
            25,
            {"host": "gpu-c", "priority_class": "batch", "team": "ads", "place": 2, "eta_s": 60.0},
        ),
    )

    code, lines = cli(fleet, "jobs", "--state", "queued", "--slots", "1")
    assert code == 0, lines
    assert lines[0].split() == ["REQUEST", "CLASS", "TEAM", "PLACE", "ETA", "WAITING", "METHOD", "WHERE"]
    listed = rows(lines)
    # The fleet's order: the class first; then the teams' fair share (search's b0 placed first, ads's held-1 is
    # next though it came later), then arrival. run-1 runs: not listed.
    assert list(listed) == ["u1", "b0", "held-1", "b1", "b2", "junk-1"]
    assert listed["u1"][1:4] == ["urgent", "fixes", "1"] and listed["u1"][5:8] == ["unread", "sft", f"{urgent}[0]@0"]
    assert (
        listed["b0"][1:4] == ["batch", "search", "2"]
        and listed["b0"][5] == "claimed"
        and listed["b0"][7] == f"{fleet.claims_topic}[0]@0"
    )
    assert listed["b1"][3] == "4" and listed["b1"][7] == f"{batch}[0]@1" and listed["b2"][7] == f"{batch}[0]@2"
    assert (
        listed["held-1"][1:4] == ["batch", "ads", "3"]
        and listed["held-1"][5] == "queued"
        and "on gpu-c" in " ".join(listed["held-1"])
    )
    assert listed["junk-1"][3] == "-" and "not a request (not_json" in " ".join(listed["junk-1"])
    assert all(
        row[4] == "-" for row in listed.values()
    )  # one slot, held by run-1, and no job's duration known: no ETA guessed

    # Without --slots: one host (gpu-b) started a job lately, so one slot; the same places.
    assert list(rows(cli(fleet, "jobs", "--state", "queued")[1])) == list(listed)
    # Filters: the same as for the events' table.
    assert list(rows(cli(fleet, "jobs", "--state", "queued", "--host", "gpu-c")[1])) == ["held-1"]
    assert list(rows(cli(fleet, "jobs", "--state", "queued", "--since", "10m")[1])) == ["u1", "junk-1"]
    # With another state: its table, then the waiting requests'.
    code, lines = cli(fleet, "jobs", "--state", "running", "--state", "queued")
    assert code == 0 and lines[0].split()[:2] == ["REQUEST", "STATE"] and lines[1].split()[:2] == ["run-1", "running"]
    assert lines[2] == "" and lines[3].split()[:2] == ["REQUEST", "CLASS"] and len(lines) == 4 + len(listed)
    # Issue 63: --json, one array of the same requests in the same order, each with its place, ETA and where it waits.
    result = runner.invoke(
        app, ["jobs", "--state", "queued", "--slots", "1", "--json"], env=settings_environment(fleet)
    )
    assert result.exit_code == 0, result.stderr
    said = {each["request_id"]: each for each in json.loads(result.stdout)}
    assert list(said) == list(listed) and {each["state"] for each in said.values()} == {"queued"}
    assert [said[request_id]["place"] for request_id in ("u1", "b0", "held-1", "b1", "b2", "junk-1")] == [
        1,
        2,
        3,
        4,
        5,
        None,
    ]
    assert (said["u1"]["priority_class"], said["u1"]["team"], said["u1"]["stage"], said["u1"]["where"]) == (
        "urgent",
        "fixes",
        "unread",
        f"{urgent}[0]@0",
    )
    assert said["b1"]["of"] == 5 and said["b1"]["eta_s"] is None and said["b1"]["method"] == "sft"
    assert said["held-1"]["host"] == "gpu-c" and said["junk-1"]["stage"] == "undecodable"
    result = runner.invoke(
        app, ["jobs", "--state", "running", "--state", "queued", "--json"], env=settings_environment(fleet)
    )
    mixed = json.loads(result.stdout)
    assert [(each["request_id"], each["state"]) for each in mixed[:2]] == [("run-1", "running"), ("u1", "queued")]
    assert len(mixed) == 1 + len(listed) and mixed[0]["method"] == "sft" and "place" not in mixed[0]

    code, lines = cli(fleet, "get", "b1", "--slots", "1")
    assert (
        code == 0
        and len(lines) == 1
        and lines[0].startswith(
            f"b1: waiting (unread) in {batch}[0]@1, class batch, team search, place 4 of 5, starts in unknown (nothing "
            "to estimate from); worked out at "
        )
    )
    result = runner.invoke(app, ["get", "b1", "--slots", "1", "--json"], env=settings_environment(fleet))
    assert result.exit_code == 0, result.stderr
    got = json.loads(result.stdout)
    assert (got["request_id"], got["state"], got["method"], got["history"]) == ("b1", "queued", None, [])
    assert {key: got["waiting"][key] for key in ("place", "of", "eta_s", "stage", "where", "team")} == {
        "place": 4,
        "of": 5,
        "eta_s": None,
        "stage": "unread",
        "where": f"{batch}[0]@1",
        "team": "search",
    }
    assert datetime.fromisoformat(got["waiting"]["worked_out_at"]) > NOW
    code, lines = cli(fleet, "get", "held-1")
    assert (
        code == 0
        and lines[0].split()[2] == "queued"
        and lines[-1].startswith("held-1: waiting (queued) on gpu-c, class batch, team ads, place 3 of 5")
    )
    code, lines = cli(fleet, "get", "nowhere-1")
    assert code == 1 and "waits in none of the queues" in lines[-1]


def test_a_request_cancelled_while_it_waits_leaves_the_queue_at_once_and_get_says_its_cancel_is_pending(
    fleet: Settings,
) -> None:
    """Issue 57: cancelled while queued, a request was listed waiting, with a place and an ETA, and counted in the
    others' places, until a host reached it and published `cancelled`; nothing said a cancel was pending."""
    batch = fleet.class_topics["batch"]
    write(fleet, batch, *[sft_request(f"w{n}", team="search") for n in range(1, 4)], minutes_ago=10)
    code, lines = cli(
        fleet, "cancel", "w1", "--reason", "not needed"
    )  # as an operator sends it: the control topic, keyed by its id
    assert code == 0, lines
    result = runner.invoke(app, ["jobs", "--state", "queued", "--slots", "1"], env=settings_environment(fleet))
    assert result.exit_code == 0, result.output
    listed = rows(result.stdout.splitlines())
    assert [(request_id, row[3]) for request_id, row in listed.items()] == [
        ("w2", "1"),
        ("w3", "2"),
    ]  # w1 is not ahead of them
    assert (
        "1 waiting request(s) with a cancel pending" in result.stderr
        and "w1 (sent " in result.stderr
        and "not needed" in result.stderr
    )
    code, lines = cli(fleet, "get", "w1")
    assert (
        code == 0
        and lines[-1].startswith("w1: cancel pending (sent ")
        and "not needed), its `cancelled` event not yet published" in lines[-1]
    )
    code, lines = cli(fleet, "get", "w3", "--slots", "1")
    assert code == 0 and ", place 2 of 2, " in lines[-1]


def test_a_request_held_before_a_host_reached_it_is_listed_held_until_released(fleet: Settings) -> None:
    """A hold is honoured (its `held` event) when a host reaches the request: the listing reads the control topic as
    for a cancel pending, so a held request is not placed ahead of the others meanwhile; one released is placed."""
    batch = fleet.class_topics["batch"]
    write(fleet, batch, *[sft_request(f"w{n}", team="search") for n in range(1, 4)], minutes_ago=10)
    for verb, request_id in (("hold", "w1"), ("hold", "w2"), ("release", "w2")):
        code, lines = cli(fleet, verb, request_id, "--reason", "maintenance")
        assert code == 0, lines
    code, lines = cli(fleet, "jobs", "--state", "queued", "--slots", "1")
    assert code == 0, lines
    listed = rows(lines)
    assert [(request_id, row[3], row[5]) for request_id, row in listed.items()] == [
        ("w2", "1", "unread"),
        ("w3", "2", "unread"),
        ("w1", "-", "held"),
    ]


def test_get_says_one_place_and_one_eta_for_a_waiting_request_and_when_they_were_worked_out(fleet: Settings) -> None:
    """Issue 57: `get` printed its last `queued` event's place and ETA and a fresh estimate, two different
    ones, not saying which held."""
    batch = fleet.class_topics["batch"]
    write(fleet, batch, sft_request("w1", team="search"), minutes_ago=10)
    publish(
        fleet,
        ("queued", "w1", 9, {"host": "gpu-c", "priority_class": "batch", "team": "search", "place": 7, "eta_s": 600.0}),
    )
    code, lines = cli(fleet, "get", "w1", "--slots", "1")
    assert code == 0, lines
    assert [line for line in lines if "place" in line] == [
        lines[-1]
    ]  # the queued event's place 7 and 600 s are not shown as if current
    assert lines[-1].startswith(
        f"w1: waiting (queued) in {batch}[0]@0, class batch, team search, place 1 of 1, "
        "starts in about 0s; worked out at "
    )
    assert lines[-1].endswith("Z from the queues and the events")


def test_a_genuine_accepted_written_three_times_counts_once_in_the_fleets_order(fleet: Settings) -> None:
    """Issue 61: the same signed `accepted` of vision's finished job, written again twice (it verifies each time),
    made vision look as if it still ran that job since its start: its slot-time above search's, its next request
    placed after search's, and the finished job listed as holding a slot."""
    batch = fleet.class_topics["batch"]
    write(fleet, batch, sft_request("s-next", team="search"), minutes_ago=6)
    write(fleet, batch, sft_request("v-next", team="vision"), minutes_ago=5)
    # search ran 2,000 s until 57 minutes ago; vision 1,000 s until 63 minutes ago: vision has used less.
    publish(
        fleet,
        ("accepted", "s-old", 90, {"method": "sft", "priority_class": "batch", "team": "search"}),
        ("cancelled", "s-old", 57, {}),
        ("accepted", "v-old", 80, {"method": "sft", "priority_class": "batch", "team": "vision"}),
        ("cancelled", "v-old", 63, {}),
    )
    once = rows(cli(fleet, "jobs", "--state", "queued", "--slots", "2")[1])
    assert list(once) == ["v-next", "s-next"]
    [accepted] = [
        record for record in events_written(fleet) if record["request_id"] == "v-old" and record["type"] == "accepted"
    ]
    write(
        fleet, fleet.events_topic, accepted, accepted
    )  # the same bytes, the same signature: genuine, written three times in all
    result = runner.invoke(app, ["jobs", "--state", "queued", "--slots", "2"], env=settings_environment(fleet))
    assert result.exit_code == 0, result.output
    assert (
        rows(result.stdout.splitlines()) == once
    )  # vision first still, v-old not back as holding a slot, the same ETAs
    assert (
        f"skipped 2 event(s) in {fleet.events_topic} read already or older than what is folded (2 repeated)"
        in result.stderr
    )
    code, lines = cli(fleet, "jobs")  # the events' table: v-old ended, as its last event that counts says
    assert code == 0 and [line.split()[:2] for line in lines if line.startswith("v-old")] == [["v-old", "cancelled"]]


def events_written(settings: Settings) -> list[dict[str, Any]]:
    async def read() -> list[dict[str, Any]]:
        async with TopicReader(settings, settings.events_topic) as reader:
            return [json.loads(record.value or b"") async for record in reader.records(follow=False)]

    return asyncio.run(read())


def test_an_eta_comes_from_the_running_jobs_and_recent_durations(fleet: Settings) -> None:
    write(fleet, fleet.requests_topic, sft_request("w1"), sft_request("w2"), minutes_ago=5)
    publish(
        fleet,
        (
            "succeeded",
            "old-1",
            60,
            {"method": "sft", "base_model": sft_request("x")["model"]["id"], "durations_s": {"queue": 0, "total": 600}},
        ),
        ("accepted", "run-1", 3, {"method": "sft"}),
        ("started", "run-1", 3, {"method": "sft"}),
    )
    listed = rows(cli(fleet, "jobs", "--state", "queued", "--slots", "2")[1])
    # Two slots: one free now; the other is run-1's, free when sft's typical 600 s less its 3 minutes have passed.
    assert listed["w1"][3:5] == ["1", "0s"]
    assert listed["w2"][3] == "2" and listed["w2"][4] in ("7m", "6m")  # 420 s less the seconds this test has taken


def test_a_sweep_cancels_by_team_class_and_selector_counts_and_a_dry_run_sends_nothing(fleet: Settings) -> None:
    batch, urgent = fleet.class_topics["batch"], fleet.class_topics["urgent"]
    write(
        fleet,
        batch,
        *[sft_request(f"s{n}", team="search", metadata={"sweep": "s1"}) for n in range(3)],
        sft_request("other", team="search", metadata={"sweep": "s2"}),
        minutes_ago=10,
    )
    write(
        fleet, urgent, sft_request("u1", priority_class="urgent", team="ads", metadata={"sweep": "s1"}), minutes_ago=5
    )
    write(
        fleet, fleet.claims_topic, sft_request("r1", team="search", metadata={"sweep": "s1"}), minutes_ago=9
    )  # running: claimed, started
    publish(
        fleet,
        ("accepted", "r1", 8, {"method": "sft", "priority_class": "batch", "team": "search"}),
        ("started", "r1", 8, {"method": "sft"}),
    )

    code, lines = cli(fleet, "cancel", "--team", "search", "--dry-run")
    assert code == 0 and lines[0] == "matched 5 request(s) with team search: 4 waiting, 1 running"
    assert [line.split()[:2] for line in lines[1:-1]] == [
        ["s0", "waiting"],
        ["s1", "waiting"],
        ["s2", "waiting"],
        ["other", "waiting"],
        ["r1", "running"],
    ]
    assert lines[-1].startswith("dry run: nothing sent")
    code, lines = cli(fleet, "cancel", "u1", "--dry-run")
    assert code == 0 and lines[-1].endswith("(dry run: nothing sent)")
    assert control_records(fleet) == []

    code, lines = cli(fleet, "cancel", "--class", "batch", "--selector", "sweep=s1", "--reason", "sweep s1 withdrawn")
    assert code == 0 and lines[0] == "matched 4 request(s) with class batch, metadata sweep=s1: 3 waiting, 1 running"
    assert lines[-1].startswith(f"sent 4 cancel(s) to {fleet.control_topic}")
    sent = control_records(fleet)
    assert sorted(key for key, _ in sent) == [b"r1", b"s0", b"s1", b"s2"]
    assert all(
        message == {"schema_version": 1, "type": "cancel", "request_id": key.decode(), "reason": "sweep s1 withdrawn"}
        for key, message in sent
    )

    code, lines = cli(fleet, "cancel", "--team", "nobody")
    assert code == 0 and lines == [
        "matched 0 request(s) with team nobody: 0 waiting, 0 running",
        "nothing to cancel, nothing sent",
    ]
    code, lines = cli(fleet, "cancel", "--class", "nope")
    assert code == 2 and "--class: unknown class 'nope'; one of urgent, batch" in lines[-1]
    code, lines = cli(fleet, "cancel", "s0", "--team", "search")
    assert code == 2 and "a request id or a sweep" in lines[-1]
    assert len(control_records(fleet)) == 4  # nothing more was sent


def test_claims_written_in_transactions_are_read_to_their_end_and_an_aborted_one_never_happened(
    fleet: Settings,
) -> None:
    async def claim() -> None:
        producer = AIOKafkaProducer(**kafka_options(fleet), acks="all", transactional_id=f"dispatcher-{fleet.group_id}")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(
                    fleet.claims_topic, json.dumps(sft_request("kept-1")).encode(), key=b"kept-1"
                )
            await producer.begin_transaction()
            await producer.send_and_wait(
                fleet.claims_topic, json.dumps(sft_request("aborted-1")).encode(), key=b"aborted-1"
            )
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(claim())
    # The partition ends in an abort marker: an offset, never a record. The listing reaches it and ends.
    code, lines = cli(fleet, "jobs", "--state", "queued")
    assert code == 0 and list(rows(lines)) == ["kept-1"] and rows(lines)["kept-1"][7] == f"{fleet.claims_topic}[0]@0", (
        lines
    )


def test_a_queue_topic_that_does_not_exist_is_said_and_the_others_are_listed(settings: Settings) -> None:
    fleet = settings.model_copy(
        update={
            "priority_classes": [PriorityClass(name="urgent"), PriorityClass(name="batch")],
            "claims_topic": f"claims-{settings.group_id}",
            **shared_fleet_keys(),
        }
    )  # neither the urgent topic nor the claims topic made
    write(fleet, fleet.requests_topic, sft_request("b1"))
    result = runner.invoke(app, ["jobs", "--state", "queued"], env=settings_environment(fleet))
    assert result.exit_code == 0 and list(rows(result.stdout.splitlines())) == ["b1"]
    assert f"adapterd: topic {fleet.class_topics['urgent']} does not exist; nothing waits there" in result.stderr
    assert f"adapterd: topic {fleet.claims_topic} does not exist; nothing waits there" in result.stderr


def test_without_classes_the_requests_behind_a_partitions_running_job_are_listed_with_their_place_in_it(
    settings: Settings,
) -> None:
    # One partition, no classes: running-1 was read (its offset not committed until it ends); w1 and w2 wait behind it.
    write(
        settings,
        settings.requests_topic,
        sft_request("running-1"),
        sft_request("w1", team="search"),
        sft_request("w2"),
        minutes_ago=3,
    )
    publish(
        settings,
        (
            "succeeded",
            "old-1",
            60,
            {"method": "sft", "base_model": sft_request("x")["model"]["id"], "durations_s": {"queue": 0, "total": 100}},
        ),
        ("accepted", "running-1", 2, {"method": "sft"}),
        ("started", "running-1", 2, {"method": "sft"}),
        ("progress", "running-1", 0, {"step": 5, "total_steps": 50, "eta_s": 600.0}),
    )
    code, lines = cli(settings, "jobs", "--state", "queued")
    listed = rows(lines)
    assert code == 0 and list(listed) == ["w1", "w2"]
    assert listed["w1"][1:4] == ["-", "search", "1"] and listed["w2"][1:4] == ["-", "default", "2"]
    assert (
        listed["w1"][4] in ("10m", "9m") and listed["w1"][7] == f"{settings.requests_topic}[0]@1"
    )  # running-1's own ETA
    code, lines = cli(settings, "get", "w2")
    assert code == 0 and lines[-1].startswith(
        f"w2: waiting (unread) in {settings.requests_topic}[0]@2, class -, team default, place 2 of 2 in its partition"
    )
