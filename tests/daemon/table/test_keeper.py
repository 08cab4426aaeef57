"""The table's keeper on the real broker (daemon/table/keeper.py): the state topic follows the events topic as the one
fold says (`adapterd jobs`' `fold`), through a daemon SIGKILLed while events went on (repaired from its committed
offset when it starts again), tombstones an entry ended past its retention, and writes a genuine entry again over a
forged one."""

from __future__ import annotations

import asyncio
import json
import secrets
import signal
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer

from daemon.cli.jobs import fold
from daemon.kafka.admin.group_offsets import committed_offsets
from daemon.kafka.admin.topics import ensure_topics, topic_config
from daemon.kafka.options import kafka_options
from daemon.kafka.publisher import Publisher
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys
from daemon.table.codec import (
    Refused,
    Seal,
    Tombstone,
    digest,
    digest_text,
    entry_headers,
    entry_value,
    is_seal,
    read_entry,
    seal_key,
)
from daemon.table.entry import TableEntry
from daemon.table.keeper import KafkaTable, Keeper
from daemon.table.reader import read_table
from daemon.table.topic import keeper_group
from schemas import Event, parse_event
from schemas.signing import EventKeys, EventSigner, new_key_pair, read_private_key
from testbed.fleet_keys import fleet_keys
from testbed.processes import DaemonProcess, wait_until_gone
from tests.helpers import event_document

Found = TableEntry | Tombstone | Refused


async def table_settings(settings: Settings, tmp_path: Path, partitions: int = 2, **more: Any) -> Settings:
    """The test's settings with events and state topics of `partitions` of their own, and the fleet's signing key."""
    suffix = uuid.uuid4().hex[:8]
    keyed = settings.model_copy(
        update={
            **fleet_keys(tmp_path / "keys"),
            "events_topic": f"events-table-{suffix}",
            "state_topic": f"state-table-{suffix}",
            **more,
        }
    )
    await ensure_topics(keyed, partitions=partitions)
    return keyed


def event(kind: str, request_id: str, **fields: Any) -> Event:
    document = event_document(kind, request_id=request_id, event_id=secrets.token_hex(16), host="h1", **fields)
    return parse_event(json.dumps(document).encode())


def lifecycle(request_id: str, *kinds: str) -> list[Event]:
    return [event(kind, request_id, **({"step": n} if kind == "progress" else {})) for n, kind in enumerate(kinds)]


async def publish(settings: Settings, events: list[Event]) -> None:
    """Published as a host publishes them: signed with the fleet's key, keyed by request id."""
    publisher = Publisher(settings)
    await publisher.start()
    try:
        for each in events:
            await publisher.publish(each)
    finally:
        await publisher.stop()


def state(found: Found | None) -> str | None:
    return found.state if isinstance(found, TableEntry) else None


def placeless(found: Found) -> Found:
    return found.model_copy(update={"partition": -1, "offset": -1}) if isinstance(found, TableEntry) else found


async def table_when(
    settings: Settings, wanted: Callable[[dict[str, Found]], bool], within_s: float = 120.0
) -> dict[str, Found]:
    """The state topic as a table (each key's latest record, verified with the fleet's keys), read and followed until
    it is as `wanted` says: judged once every record there at the start is read (the table as it was part-way is
    not the table), then at each record written since; an AssertionError with what it was otherwise."""
    keys = event_keys(settings)
    table: dict[str, Found] = {}
    try:
        async with asyncio.timeout(within_s), TopicReader(settings, settings.state_topic) as reader:
            behind = {tp.partition: end for tp, end in reader.ends.items() if end > 0}
            if not behind and wanted(table):
                return table
            async for record in reader.records(follow=True):
                if not is_seal(record):  # the keepers' seals: read by the table's reader (test_seals)
                    table[(record.key or b"").decode()] = read_entry(record, keys)
                if record.offset + 1 >= behind.get(record.partition, 0):
                    behind.pop(record.partition, None)
                if not behind and wanted(table):
                    return table
    except TimeoutError:
        said = {key: getattr(found, "state", found) for key, found in table.items()}
        raise AssertionError(f"the table never got there: {said}") from None
    raise AssertionError("unreachable")


async def table_now(settings: Settings) -> dict[str, Found]:
    keys = event_keys(settings)
    async with TopicReader(settings, settings.state_topic) as reader:
        return {
            (record.key or b"").decode(): read_entry(record, keys)
            async for record in reader.records(follow=False)
            if not is_seal(record)
        }


def folds_to(events: list[Event]) -> Callable[[dict[str, Found]], bool]:
    expected = fold(events)
    return lambda table: {key: placeless(found) for key, found in table.items()} == expected


async def keeping(keeper: Keeper) -> asyncio.Task[None]:
    return asyncio.create_task(keeper.run())


async def stopped(keeper: Keeper, task: asyncio.Task[None]) -> None:
    keeper.stop()
    await asyncio.wait_for(task, 60)


async def test_the_keeper_writes_the_fold_of_the_events_of_every_partition(settings: Settings, tmp_path: Path) -> None:
    keyed = await table_settings(settings, tmp_path)
    topic = await topic_config(keyed, keyed.state_topic)
    assert topic["cleanup.policy"] == "compact" and topic["segment.ms"] == "3600000"  # `adapterd topics` made it
    events = [
        each
        for n in range(6)
        for each in lifecycle(f"follow-{n}", "accepted", "started", "progress", "progress", "succeeded")[: 2 + n % 4]
    ]
    await publish(keyed, events)
    keeper = Keeper(keyed, KafkaTable(keyed))
    task = await keeping(keeper)
    try:
        table = await table_when(keyed, folds_to(events))
    finally:
        await stopped(keeper, task)
    assert {entry.partition for entry in table.values() if isinstance(entry, TableEntry)} == {0, 1}
    # Stopped gracefully: what it wrote is committed, so the table is whole up to the keepers' committed offsets.
    group = keeper_group(keyed.group_id)
    committed = await committed_offsets(keyed, [(group, keyed.events_topic)])
    async with TopicReader(keyed, keyed.events_topic) as reader:
        ends = {tp.partition: end for tp, end in reader.ends.items()}
    assert committed[(group, keyed.events_topic)] == ends
    # Its entries are signed as events are: none refused with the fleet's keys, every one refused without them.
    assert all(isinstance(found, TableEntry) for found in table.values())


async def test_a_daemon_sigkilled_while_events_go_on_is_followed_by_the_table_when_it_starts_again(
    settings: Settings, tmp_path: Path
) -> None:
    keyed = await table_settings(settings, tmp_path, session_timeout_ms=6_000, warm_child=False)
    first = [each for n in range(4) for each in lifecycle(f"killed-{n}", "accepted", "started")]
    await publish(keyed, first)
    host = DaemonProcess(keyed, tmp_path / "daemon.log").start()
    again: DaemonProcess | None = None
    try:
        await table_when(keyed, folds_to(first))
        assert host.process is not None
        host.process.send_signal(signal.SIGKILL)
        await wait_until_gone(host.process.pid)
        # Events while no keeper runs: each request's latest event has no entry yet, and new requests none at all.
        later = [
            *(each for n in range(4) for each in lifecycle(f"killed-{n}", "progress", "succeeded")),
            *lifecycle("killed-new", "accepted", "started"),
        ]
        await publish(keyed, later)
        assert not folds_to([*first, *later])(await table_now(keyed))  # the table lags the events
        again = DaemonProcess(keyed, tmp_path / "daemon-again.log").start()
        await table_when(keyed, folds_to([*first, *later]))
    finally:
        host.stop()
        if again is not None:
            again.stop()


async def test_a_reader_of_the_whole_table_verifies_the_keepers_seals_not_each_entry(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 59: `adapterd jobs` verified each of 22,605 entries (2.7 s of its 5.4): it verifies the partitions'
    seals and takes each entry whose value they hold; a forged entry, or a forged seal vouching for it, is refused."""
    keyed = await table_settings(settings, tmp_path)
    events = [each for n in range(30) for each in lifecycle(f"sealed-{n}", "accepted", "started")]
    await publish(keyed, events)
    keeper = Keeper(keyed, KafkaTable(keyed), seal_every_s=0.0)  # sealed after every turn that wrote
    task = await keeping(keeper)
    try:
        await table_when(keyed, folds_to(events))
    finally:
        await stopped(keeper, task)  # its turn in hand ends first: the last writes sealed
    calls: list[bytes] = []
    verify = EventKeys.verify

    def counted(self: EventKeys, value: bytes, headers: Any) -> None:
        calls.append(value)
        verify(self, value, headers)

    monkeypatch.setattr(EventKeys, "verify", counted)
    read = await read_table(keyed, tail=False)
    assert {key: placeless(entry) for key, entry in read.entries.items()} == fold(events) and not read.refused
    assert len(calls) == 2 and all(b'"digests"' in value for value in calls)  # the two partitions' seals alone

    # A forged entry under a sealed key, with a forged seal of its partition vouching for it: both refused, and the
    # genuine entry taken (read again past the forged record).
    genuine = read.entries["sealed-7"]
    forged = entry_value(genuine.model_copy(update={"state": "succeeded", "detail": "forged"}))
    stranger = EventSigner(read_private_key(new_key_pair()[0]))
    seal = (
        Seal(
            partition=genuine.partition,
            generation="forged",
            sealed_at=time.time(),
            chunk=0,
            chunks=1,
            digests={"sealed-7": digest_text(digest(forged))},
        )
        .model_dump_json()
        .encode()
    )
    producer = AIOKafkaProducer(**kafka_options(keyed))
    await producer.start()
    try:
        for key, value in ((b"sealed-7", forged), (seal_key(genuine.partition, 0), seal)):
            headers = entry_headers(value, stranger)
            await producer.send_and_wait(
                keyed.state_topic, value, key=key, partition=genuine.partition, headers=headers
            )
    finally:
        await producer.stop()
    calls.clear()
    again = await read_table(keyed, tail=False)
    assert again.entries["sealed-7"] == genuine and again.refused == {"unknown_key": 2}
    # The forged partition's entries verified one by one (its seal refused), the other's by its seal.
    assert len(calls) > 2


async def test_an_entry_ended_past_its_retention_is_tombstoned(settings: Settings, tmp_path: Path) -> None:
    keyed = await table_settings(settings, tmp_path, partitions=1)
    old = (datetime.now(UTC) - timedelta(seconds=keyed.state_retention_s + 3600)).isoformat()
    events = [
        *lifecycle("ends-now", "accepted", "succeeded"),
        *lifecycle("runs", "accepted", "started"),
        # Ended long ago (its events read late): its entry is its tombstone at once.
        event("accepted", "ended-long-ago", time=old),
        event("failed", "ended-long-ago", time=old),
    ]
    await publish(keyed, events)
    keeper = Keeper(keyed, KafkaTable(keyed))
    task = await keeping(keeper)
    try:
        await table_when(
            keyed,
            lambda table: (
                table.get("ended-long-ago") == Tombstone("ended-long-ago")
                and state(table.get("ends-now")) == "succeeded"
                and state(table.get("runs")) == "running"
            ),
        )
    finally:
        await stopped(keeper, task)
    # A keeper a retention later: the restore tombstones what has ended since, and keeps what runs.
    later = Keeper(keyed, KafkaTable(keyed), clock=lambda: time.time() + keyed.state_retention_s + 60)
    task = await keeping(later)
    try:
        table = await table_when(keyed, lambda table: table["ends-now"] == Tombstone("ends-now"))
    finally:
        await stopped(later, task)
    assert state(table["runs"]) == "running"


@pytest.mark.parametrize("forgery", ["untrusted key", "unsigned", "while kept"])
async def test_a_forged_entry_is_ignored_and_the_genuine_one_written_again(
    settings: Settings, tmp_path: Path, forgery: str
) -> None:
    """Forged while no keeper ran: the next one's restore writes the genuine entry over it; forged while one keeps
    the partition: its audit does (every SWEEP_INTERVAL_S; here every 0.2 s)."""
    keyed = await table_settings(settings, tmp_path, partitions=1)
    events = lifecycle("forged", "accepted", "started")
    await publish(keyed, events)
    keeper = Keeper(keyed, KafkaTable(keyed))
    task = await keeping(keeper)
    try:
        table = await table_when(keyed, folds_to(events))
    finally:
        await stopped(keeper, task)
    genuine = table["forged"]
    assert isinstance(genuine, TableEntry)
    value = entry_value(genuine.model_copy(update={"state": "succeeded", "offset": genuine.offset + 1000}))
    signer = EventSigner(read_private_key(new_key_pair()[0])) if forgery != "unsigned" else None
    if forgery == "while kept":
        keeper = Keeper(keyed, KafkaTable(keyed), sweep_every_s=0.2)
        task = await keeping(keeper)
        async with asyncio.timeout(60):
            while 0 not in keeper.kept:  # restored (no event says it): what it writes over now, its audits do
                await asyncio.sleep(0.05)
    producer = AIOKafkaProducer(**kafka_options(keyed))
    await producer.start()
    try:
        headers = entry_headers(value, signer)
        await producer.send_and_wait(keyed.state_topic, value, key=b"forged", partition=0, headers=headers)
    finally:
        await producer.stop()
    if forgery != "while kept":
        assert isinstance((await table_now(keyed))["forged"], Refused)  # the table's latest record is the forgery
        keeper = Keeper(keyed, KafkaTable(keyed))
        task = await keeping(keeper)
    try:
        await table_when(keyed, lambda table: table["forged"] == genuine)
    finally:
        await stopped(keeper, task)


async def test_a_poll_writes_each_changed_entry_once_however_many_chunks_changed_it(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A keeper folds a poll's events a chunk at a time in worker threads; an entry several chunks changed is written
    once, its latest: a keeper catching up with a history otherwise writes a request's entry at every chunk of every
    round, and the state topic holds many times its requests until the broker compacts it."""
    from daemon.table import keeper as keeping_module

    monkeypatch.setattr(keeping_module, "CHUNK", 1)  # each event a chunk of its own
    keyed = await table_settings(settings, tmp_path, partitions=1)
    events = [each for n in range(3) for each in lifecycle(f"once-{n}", "accepted", "started", "progress", "succeeded")]
    await publish(keyed, events)
    keeper = Keeper(keyed, KafkaTable(keyed))
    task = await keeping(keeper)
    try:
        await table_when(keyed, folds_to(events))
    finally:
        await stopped(keeper, task)
    async with TopicReader(keyed, keyed.state_topic) as reader:
        keys = [record.key async for record in reader.records(follow=False) if not is_seal(record)]
    assert sorted(keys) == [b"once-0", b"once-1", b"once-2"]  # one poll, one record a request (12 events folded)
