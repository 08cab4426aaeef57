"""`adapterd jobs` and `adapterd get` from the table of requests, against a real broker: the same listing and the
same history as the fold of every event (`daemon.cli.jobs.fold` of `history`: what both verbs showed before the
table), whether the table is kept to the end of the events topic, lags behind it (its keepers' committed offsets
half-way), or is not kept at all; a forged entry ignored and said; `get` reading one partition of each topic.

The table's keeper is not what is tested here: `keep` writes the entries as it does, each changed
entry signed to the partition number its event came from, and commits the keepers' group's offsets."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.cli.console import describe
from daemon.cli.jobs import COLUMNS, fold, history, row
from daemon.cli.listing import plain
from daemon.kafka.options import kafka_options
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.secret_files import event_signer
from daemon.table import reader as table_reader
from daemon.table.codec import entry_headers, entry_value
from daemon.table.entry import TableEntry, folded
from daemon.table.reader import TableRead, key_partition, read_table
from daemon.table.topic import COMPACTED, keeper_group
from schemas import Event, parse_event
from schemas.signing import SIGNATURE_HEADER, EventSigner
from testbed.fleet_keys import fleet_keys
from testbed.processes import settings_environment
from tests.helpers import event_document

runner = CliRunner()
PARTITIONS = 4
NOW = datetime.now(UTC)


@pytest.fixture(autouse=True)
def now() -> None:
    global NOW
    NOW = datetime.now(UTC)


@pytest.fixture
def fleet(settings: Settings, tmp_path: Any) -> Iterator[Settings]:
    """The test's settings with the fleet's signing key, and an events topic and a state topic of 4 partitions."""
    fleet = settings.model_copy(
        update={
            "events_topic": f"{settings.events_topic}-4",
            "state_topic": f"{settings.state_topic}-4",
            **fleet_keys(tmp_path / "keys"),
        }
    )
    asyncio.run(create_topics(fleet))
    yield fleet


async def create_topics(settings: Settings) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(settings.events_topic, PARTITIONS, 1),
                NewTopic(settings.state_topic, PARTITIONS, 1, topic_configs=COMPACTED),
            ]
        )
    finally:
        await admin.close()


def event(kind: str, request_id: str, minutes_ago: float, **fields: Any) -> Event:
    document = event_document(
        kind,
        request_id=request_id,
        host=fields.pop("host", "gpu-a"),
        time=(NOW - timedelta(minutes=minutes_ago)).isoformat(),
        event_id=secrets.token_hex(16),
        **fields,
    )
    return parse_event(json.dumps(document).encode())


def lives(request_id: str, start: float) -> list[Event]:
    """Each request's events by what its id ends with: every state a request ends its events in. The times are hours
    and a half back, so each line's `LAST` reads the same by the CLI's clock and the test's."""
    ending = request_id.rsplit("-", 1)[0]
    accepted = event("accepted", request_id, start, method="sft")
    started = event("started", request_id, start - 1, method="sft")
    progress = [event("progress", request_id, start - 2 - step, step=step, total_steps=4) for step in (1, 2, 3)]
    ends = {
        "done": [
            event(
                "succeeded",
                request_id,
                start - 6,
                method="sft",
                repo_id=f"my-org/{request_id}",
                revision="main",
                published="main",
            )
        ],
        "broken": [
            event("retrying", request_id, start - 6, code="hub_unavailable", stage="push"),
            event("accepted", request_id, start - 7, method="sft", attempt=2),
            event(
                "failed",
                request_id,
                start - 8,
                code="dataset_invalid",
                stage="preflight",
                message="row 3 is empty",
                attempt=2,
            ),
        ],
        "busy": [],
        "stopped": [event("cancelled", request_id, start - 6)],
    }
    return [accepted, started, *progress, *ends[ending]]


def fleet_events() -> list[Event]:
    """Twelve requests' events, interleaved as hosts publish them: each partition holds several requests' events."""
    ids = [f"{kind}-{number}" for number in range(3) for kind in ("done", "broken", "busy", "stopped")]
    each = [lives(request_id, 150 + 20 * (number % 3) + number) for number, request_id in enumerate(ids)]
    return sorted((event for life in each for event in life), key=lambda event: event.time)


def publish(settings: Settings, events: list[Event]) -> None:
    """As the fleet's hosts publish them: signed, keyed by the request id, stamped with the event's time."""

    async def send() -> None:
        signer = event_signer(settings)
        assert signer is not None
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
        await producer.start()
        try:
            for each in events:
                value = each.model_dump_json().encode()
                await producer.send_and_wait(
                    settings.events_topic,
                    value,
                    key=(each.request_id or "").encode(),
                    timestamp_ms=int(each.time.timestamp() * 1000),
                    headers=[(SIGNATURE_HEADER, signer.sign(value))],
                )
        finally:
            await producer.stop()

    asyncio.run(send())


def keep(settings: Settings, upto: dict[int, int] | None = None, signer: EventSigner | None = None) -> dict[int, int]:
    """What the table's keepers do, to each events partition's offset in `upto` (None: its end): fold the events
    into entries, write each changed entry (signed with `signer`, the host's own by default) to the partition its
    event came from, then commit the keepers' group's offsets past them. The offsets committed."""

    async def run() -> dict[int, int]:
        entries: dict[str, TableEntry] = {}
        committed: dict[int, int] = {}
        async with TopicReader(settings, settings.events_topic) as reader:
            records = [record async for record in reader.records(follow=False)]
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
        await producer.start()
        try:
            for record in records:
                if upto is not None and record.offset >= upto.get(record.partition, 0):
                    continue
                event = parse_event(record.value or b"")
                entry = folded(entries.get(event.request_id or ""), event, record.partition, record.offset)
                if entry is not None:
                    entries[entry.request_id] = entry
                    await write_entry(producer, settings, entry, record.partition, signer or event_signer(settings))
                committed[record.partition] = record.offset + 1
        finally:
            await producer.stop()
        await commit(settings, committed)
        return committed

    return asyncio.run(run())


async def write_entry(
    producer: AIOKafkaProducer, settings: Settings, entry: TableEntry, partition: int, signer: EventSigner | None
) -> None:
    value = entry_value(entry)
    await producer.send_and_wait(
        settings.state_topic,
        value,
        key=entry.request_id.encode(),
        partition=partition,
        headers=entry_headers(value, signer),
    )


async def commit(settings: Settings, offsets: dict[int, int]) -> None:
    consumer = AIOKafkaConsumer(
        **kafka_options(settings), group_id=keeper_group(settings.group_id), enable_auto_commit=False
    )
    await consumer.start()
    try:
        partitions = {TopicPartition(settings.events_topic, partition): offset for partition, offset in offsets.items()}
        consumer.assign(list(partitions))
        await consumer.commit(partitions)
    finally:
        await consumer.stop()


def cli(settings: Settings, *args: str) -> tuple[int, list[str], str]:
    result = runner.invoke(app, list(args), env=settings_environment(settings))
    return result.exit_code, result.stdout.splitlines(), result.stderr


def expected_jobs(settings: Settings) -> list[str]:
    """`adapterd jobs` as it was before the table: every event folded."""
    jobs = fold(asyncio.run(history(settings)))
    now = datetime.now(UTC)
    in_order = sorted(jobs.values(), key=lambda job: (job.last, job.since))
    return plain(COLUMNS, [row(job, now) for job in in_order]).splitlines()


def expected_get(settings: Settings, request_id: str) -> list[str]:
    """`adapterd get ID` of a request that runs or ended, as it was before the table: its events, the latest progress
    only, then its state folded from them."""
    events = [event for event in asyncio.run(history(settings)) if event.request_id == request_id]
    last = max(index for index, event in enumerate(events) if event.type == "progress")
    said = [
        describe(event) + (f" (step {event.step}/{event.total_steps})" if event.type == "progress" else "")
        for index, event in enumerate(events)
        if event.type != "progress" or index == last
    ]
    job = fold(events)[request_id]
    state = f"{request_id}: {job.state}, method {job.method or '-'}, attempt {job.attempt}, on {job.host}"
    return "\n".join([*said, state + (f"; {job.detail}" if job.detail else "")]).splitlines()


def ends(settings: Settings) -> dict[int, int]:
    async def read() -> dict[int, int]:
        async with TopicReader(settings, settings.events_topic) as reader:
            return {tp.partition: end for tp, end in reader.ends.items()}

    return asyncio.run(read())


def requests_of(events: list[Event]) -> list[str]:
    return sorted({event.request_id for event in events if event.request_id is not None})


SHOWN = ("done-0", "broken-1", "busy-2", "stopped-0")  # one request that ends each way, for `get`


def assert_same_as_every_event_folded(settings: Settings) -> None:
    code, lines, stderr = cli(settings, "jobs")
    assert code == 0, stderr
    assert lines == expected_jobs(settings)
    for request_id in SHOWN:
        code, lines, stderr = cli(settings, "get", request_id)
        assert code == 0, stderr
        assert lines == expected_get(settings, request_id), request_id


def test_jobs_and_get_from_a_kept_table_are_the_fold_of_every_event(fleet: Settings) -> None:
    events = fleet_events()
    publish(fleet, events)
    assert keep(fleet) == ends(fleet)
    read = asyncio.run(read_table(fleet))
    assert read.table and read.events_from == read.events_to == ends(fleet)  # the table is whole: no event past it
    assert_same_as_every_event_folded(fleet)


def test_jobs_and_get_from_a_lagging_table_fold_the_events_past_it(fleet: Settings) -> None:
    events = fleet_events()
    publish(fleet, events)
    half = {partition: end // 2 for partition, end in ends(fleet).items()}
    assert keep(fleet, half) == half  # no keeper read on: the second half of each partition is in no entry
    table = asyncio.run(read_table(fleet, tail=False))
    assert table.events_from == half and not table.events_to  # where a follower of the events begins
    read = asyncio.run(read_table(fleet))
    assert read.events_from == half and read.events_to == ends(fleet)
    assert len(read.entries) == len(requests_of(events)) > len(table.entries)
    # `adapterd jobs` reads an entry as its head, without its events, but where the tail changes it (issue 59: a fifth
    # of the parse): the same states; whole exactly where an event of the tail was folded on.
    heads = asyncio.run(read_table(fleet, heads=True))
    said = {job.request_id: (job.state, job.detail, job.last, job.attempt, job.host) for job in heads.listed()}
    assert said == {
        job.request_id: (job.state, job.detail, job.last, job.attempt, job.host) for job in read.entries.values()
    }
    assert heads.heads and all(
        type(job) is not TableEntry and job.offset < half[job.partition] for job in heads.heads.values()
    )
    assert heads.entries and all(job.offset >= half[job.partition] for job in heads.entries.values())
    assert_same_as_every_event_folded(fleet)


def test_jobs_and_get_without_a_table_fold_every_event(fleet: Settings) -> None:
    events = fleet_events()
    publish(fleet, events)
    read = asyncio.run(read_table(fleet))
    assert read.table and read.entries and read.events_from == {partition: 0 for partition in range(PARTITIONS)}
    assert_same_as_every_event_folded(fleet)
    missing = fleet.model_copy(update={"state_topic": f"{fleet.state_topic}-never-made"})
    assert not asyncio.run(read_table(missing)).table
    assert_same_as_every_event_folded(missing)


def test_a_forged_entry_is_ignored_and_said_while_the_genuine_state_is_shown(fleet: Settings) -> None:
    """An entry signed by a key the fleet does not trust, written after the genuine one: `done-0` said failed, and an
    entry for a request only its events (past the table) know. Neither is taken; each is counted on stderr, once."""
    events = fleet_events()
    publish(fleet, events)
    half = {partition: end // 2 for partition, end in ends(fleet).items()}
    keep(fleet, half)
    genuine = asyncio.run(read_table(fleet)).entries["done-0"]
    assert genuine.state == "succeeded"
    untrusted = EventSigner(Ed25519PrivateKey.generate())

    async def forge() -> None:
        producer = AIOKafkaProducer(**kafka_options(fleet), acks="all")
        await producer.start()
        try:
            lie = genuine.model_copy(update={"state": "failed", "detail": "forged", "offset": genuine.offset + 10_000})
            await write_entry(producer, fleet, lie, genuine.partition, untrusted)
            tail = folded(None, event("accepted", "busy-2", 1, method="dpo", host="evil"), 0, 0)
            assert tail is not None
            await write_entry(producer, fleet, tail, key_partition("busy-2", range(PARTITIONS)), untrusted)
        finally:
            await producer.stop()

    asyncio.run(forge())
    code, lines, stderr = cli(fleet, "jobs")
    assert code == 0 and lines == expected_jobs(fleet)
    assert "forged" not in "\n".join(lines) and "evil" not in "\n".join(lines)
    said = f"adapterd: ignored 2 entry(ies) in {fleet.state_topic} without a valid signature of a trusted key"
    assert stderr.count(said) == 1 and "(2 unknown_key)" in stderr
    for request_id in ("done-0", "busy-2"):
        code, lines, stderr = cli(fleet, "get", request_id)
        assert code == 0 and lines == expected_get(fleet, request_id)
        assert "ignored 1 entry(ies)" in stderr and "(1 unknown_key)" in stderr


def test_a_forged_latest_record_of_a_key_leaves_its_genuine_entry_in_the_table(fleet: Settings) -> None:
    """The reader verifies only each key's latest record of the state topic (a partition not yet compacted holds many
    of a key); where that one is refused, the key's records are read again for the latest one a trusted key signed."""
    publish(fleet, fleet_events())
    keep(fleet)
    table = asyncio.run(read_table(fleet, tail=False)).entries
    request_id = sorted(table)[0]
    genuine = table[request_id]
    untrusted = EventSigner(Ed25519PrivateKey.generate())

    async def forge() -> None:
        producer = AIOKafkaProducer(**kafka_options(fleet), acks="all")
        await producer.start()
        try:
            lie = genuine.model_copy(update={"state": "failed", "offset": genuine.offset + 10_000})
            await write_entry(producer, fleet, lie, genuine.partition, untrusted)
        finally:
            await producer.stop()

    asyncio.run(forge())
    read = asyncio.run(read_table(fleet, tail=False))
    assert read.entries[request_id] == genuine and read.refused == {"unknown_key": 1}


def test_get_reads_one_partition_of_each_topic_from_its_entrys_start(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`get ID`'s reads, as the reader reports them: its key's partition of the state topic and the same-numbered one
    of the events topic, that one from the request's first event's time less a minute, where its entry says when."""
    old = [event("accepted", f"old-{number}", 600, method="sft") for number in range(20)]  # in every partition
    events = fleet_events()
    later = [event("accepted", f"later-{number}", 0, method="sft") for number in range(20)]  # after they all ended
    publish(fleet, old + events + later)
    keep(fleet)
    end = ends(fleet)
    reads: list[TableRead] = []
    read_request = table_reader.read_request

    async def seen(settings: Settings, request_id: str) -> TableRead:
        reads.append(await read_request(settings, request_id))
        return reads[-1]

    monkeypatch.setattr(table_reader, "read_request", seen)
    for request_id in SHOWN:
        code, lines, _ = cli(fleet, "get", request_id)
        assert code == 0 and lines == expected_get(fleet, request_id)
        read = reads[-1]
        partition = key_partition(request_id, range(PARTITIONS))
        assert list(read.state_to) == list(read.events_from) == list(read.events_to) == [partition]
        olds = sum(1 for each in old if key_partition(each.request_id or "", range(PARTITIONS)) == partition)
        assert read.events_from[partition] >= olds  # the old requests' events before it are not read
        assert [each.event_id for each in read.events] == [
            each.event_id for each in events if each.request_id == request_id
        ]
        # Issue 59: from past its entry's latest event to the keepers' committed offset (here the end), the partition
        # holds none of its events: stepped over, not read (a request ended days ago read every event since).
        entry = read.entries[request_id]
        assert read.skipped == {partition: (entry.offset + 1, end[partition])} and entry.offset + 1 < end[partition]


def test_the_reader_keeps_each_keys_latest_entry_drops_a_tombstoned_one_and_counts_what_it_refuses(
    fleet: Settings,
) -> None:
    """In a partition a key's later record wins and its tombstone removes it; a key in two partitions (the events
    topic given partitions since) keeps the entry of its latest event, placed highest; a genuine entry under another
    key and bytes that are no entry are refused, by why. With the keepers' offsets at the end, no event is read."""
    events = fleet_events()
    publish(fleet, events)
    keep(fleet)
    kept = asyncio.run(read_table(fleet)).entries
    signer = event_signer(fleet)
    done, busy = kept["done-0"], kept["busy-1"]
    moved = busy.model_copy(update={"partition": busy.partition + 1, "offset": 0, "detail": "moved"})
    stale = busy.model_copy(update={"partition": busy.partition - 1, "offset": 10**6, "detail": "stale"})

    async def write() -> None:
        producer = AIOKafkaProducer(**kafka_options(fleet), acks="all")
        await producer.start()
        try:
            await producer.send_and_wait(fleet.state_topic, None, key=b"done-0", partition=done.partition)
            for entry, partition in ((moved, (busy.partition + 1) % PARTITIONS), (stale, 0)):
                await write_entry(producer, fleet, entry, partition, signer)
            value = entry_value(kept["broken-0"])
            await producer.send_and_wait(
                fleet.state_topic, value, key=b"broken-9", partition=0, headers=entry_headers(value, signer)
            )
            junk = b'{"version": 1}'
            await producer.send_and_wait(fleet.state_topic, junk, key=b"junk", headers=entry_headers(junk, signer))
        finally:
            await producer.stop()

    asyncio.run(write())
    read = asyncio.run(read_table(fleet))
    assert "done-0" not in read.entries  # its events are all folded into the table: nothing brings it back
    assert read.entries["busy-1"].detail == "moved"
    assert read.refused == {"misplaced": 1, "malformed": 1} and "broken-9" not in read.entries
    assert read.events_from == read.events_to and not read.ignored
    assert {request_id: entry for request_id, entry in read.entries.items() if request_id != "busy-1"} == {
        request_id: entry for request_id, entry in kept.items() if request_id not in ("done-0", "busy-1")
    }


def test_get_finds_a_request_whose_key_hashes_elsewhere_since_the_events_topic_grew(fleet: Settings) -> None:
    """Given partitions after a request's events (`adapterd topics --grow`), its key hashes to a partition that holds
    nothing of it: `get` reads the other state partitions for its key and its events where its entry says."""
    events = fleet_events()
    publish(fleet, events)
    keep(fleet)
    moved = next(r for r in SHOWN if key_partition(r, range(PARTITIONS)) != key_partition(r, range(2 * PARTITIONS)))
    before = expected_get(fleet, moved)

    async def grow() -> None:
        admin = AIOKafkaAdminClient(**kafka_options(fleet))
        await admin.start()
        try:
            await admin.create_partitions(
                {topic: NewPartitions(2 * PARTITIONS) for topic in (fleet.events_topic, fleet.state_topic)}
            )
        finally:
            await admin.close()

    asyncio.run(grow())
    code, lines, stderr = cli(fleet, "get", moved)
    assert code == 0, stderr
    assert lines == before
    read = asyncio.run(table_reader.read_request(fleet, moved))
    assert set(read.events_to) == {key_partition(moved, range(PARTITIONS)), key_partition(moved, range(2 * PARTITIONS))}


def test_a_state_partition_never_written_has_its_events_read_from_their_beginning(fleet: Settings) -> None:
    """The keepers' offsets committed at the end, but the state topic empty (made again, say): nothing in the table
    holds what they committed past, so every event is read, not none."""
    events = fleet_events()
    publish(fleet, events)
    asyncio.run(commit(fleet, ends(fleet)))
    read = asyncio.run(read_table(fleet))
    assert read.events_from == {partition: 0 for partition in range(PARTITIONS)}
    assert len(read.entries) == len(requests_of(events))
    code, lines, _ = cli(fleet, "jobs")
    assert code == 0 and lines == expected_jobs(fleet)


def test_a_coordinator_still_loading_the_keepers_offsets_is_asked_again_not_read_as_no_table(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 59: a broker just started answers a group's offsets with none for a moment while its coordinator loads
    them (seen: 0.5 s; aiokafka reads no error), and `adapterd jobs` then folded every event of a week (117 s). Where
    the state topic holds entries, which a keeper writes only before committing, none committed is asked again."""
    events = fleet_events()
    publish(fleet, events)
    committed = keep(fleet)
    asked: list[int] = []
    real = table_reader.committed_offsets

    async def loading(settings: Settings, wanted: Any) -> dict[tuple[str, str], dict[int, int]]:
        asked.append(1)
        found = await real(settings, wanted)
        return {where: {} for where in found} if len(asked) <= 2 else found  # none, twice, as a loading one says

    monkeypatch.setattr(table_reader, "committed_offsets", loading)
    monkeypatch.setattr(table_reader, "LOADING_S", 0.01)
    read = asyncio.run(read_table(fleet))
    assert len(asked) == 3 and read.events_from == committed  # the tail from the keepers' offsets, not the beginning
    # No entry in a state topic (here none at all): none committed is the answer, asked once.
    asked.clear()
    missing = fleet.model_copy(update={"state_topic": f"{fleet.state_topic}-never-made"})
    assert asyncio.run(table_reader._keepers_committed(missing)) == {} and len(asked) == 1


def test_the_table_is_read_with_no_full_collection_of_what_it_loads(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 59: each full garbage collection while 22,605 entries load walks them all (`adapterd jobs` 2.5 s with none,
    3.1 to 3.4 with them). The oldest generation's automatic collections are held off while the entries are read, and
    the thresholds set back after."""
    import gc

    publish(fleet, fleet_events())
    keep(fleet)
    while_read: list[tuple[int, int, int]] = []
    read_entries = table_reader._read_entries

    async def watched(*args: Any, **kwargs: Any) -> None:
        while_read.append(gc.get_threshold())
        await read_entries(*args, **kwargs)
        while_read.append(gc.get_threshold())

    monkeypatch.setattr(table_reader, "_read_entries", watched)
    before = gc.get_threshold()
    read = asyncio.run(read_table(fleet))
    assert read.entries and while_read and all(oldest >= 1 << 30 for _, _, oldest in while_read)
    assert gc.get_threshold() == before
