"""The table keeper's fold and restore without a broker (daemon/table/kept.py): a batch of events folds into the
entries it changes, written once per request, verified and refused as events are; an entry ended past its retention
becomes its tombstone; a state partition restores each key's newest genuine entry and writes it again wherever the
topic's latest record of the key is not it (forged, replayed, an older entry, a tombstone too early)."""

from __future__ import annotations

import gc
import json
import secrets
from datetime import UTC, datetime, timedelta
from typing import Any

from daemon.cli.jobs import fold
from daemon.table.codec import Refused, Tombstone, entry_headers, entry_value, read_entry
from daemon.table.entry import TableEntry
from daemon.table.kept import WRITTEN_MAX, KeptPartition, Restoring, Write, tombstone_write
from schemas import parse_event
from schemas.signing import SIGNATURE_HEADER, EventKeys, EventSigner, new_key_pair, read_private_key
from testbed.memory_kafka import FakeRecord
from tests.helpers import event_document

DAY = 86_400.0
RETENTION = 7 * DAY


def signer() -> tuple[EventSigner, EventKeys]:
    pem, public = new_key_pair()
    return EventSigner(read_private_key(pem)), EventKeys.parse([public])


def event_bytes(kind: str, request_id: str, **fields: Any) -> bytes:
    """An event of now unless `fields` say its time: docs/events.md's examples are of 2026-11-30, which passed the
    table's seven days of retention on 2026-12-07, when the entries they made became tombstones."""
    fields.setdefault("time", datetime.now(UTC).isoformat())
    document = event_document(kind, request_id=request_id, event_id=secrets.token_hex(16), host="h1", **fields)
    return json.dumps(document).encode()


def records(values: list[bytes], sign: EventSigner | None, partition: int = 0, first: int = 0) -> list[FakeRecord]:
    return [
        FakeRecord(
            "events",
            partition,
            first + index,
            json.loads(value)["request_id"].encode(),  # keyed by its request, as the publisher keys it
            value,
            [(SIGNATURE_HEADER, sign.sign(value))] if sign else [],
        )
        for index, value in enumerate(values)
    ]


def signed(value: bytes, sign: EventSigner) -> list[tuple[str, bytes]]:
    return entry_headers(value, sign)


def state_record(write: Write, offset: int, partition: int = 0) -> FakeRecord:
    return FakeRecord("state", partition, offset, write.key, write.value, list(write.headers))


def entries_of(writes: list[Write], keys: EventKeys) -> dict[str, TableEntry | Tombstone | Refused]:
    return {write.key.decode(): read_entry(state_record(write, offset), keys) for offset, write in enumerate(writes)}


def placeless(entry: TableEntry) -> TableEntry:
    return entry.model_copy(update={"partition": -1, "offset": -1})


def test_a_batch_writes_each_changed_request_once_as_the_fold_says_signed_and_refuses_what_no_trusted_key_signed() -> (
    None
):
    sign, keys = signer()
    values = [
        event_bytes("accepted", "r1"),
        event_bytes("accepted", "r2"),
        event_bytes("started", "r1"),
        event_bytes("progress", "r1", step=1),
    ]
    forged_signer, _ = signer()
    forged = records([event_bytes("failed", "r1")], forged_signer, first=len(values))  # signed, by no trusted key
    unsigned = records([event_bytes("failed", "r2")], None, first=len(values) + 1)
    [genuine_r2] = records([event_bytes("failed", "r2")], sign, first=len(values) + 2)
    misplaced = FakeRecord("events", 0, len(values) + 2, b"r1", genuine_r2.value, genuine_r2.headers)  # under r1's key
    kept = KeptPartition(0)
    written = kept.fold(
        [*records(values, sign), *forged, *unsigned, misplaced], keys, sign, datetime.now(UTC).timestamp(), RETENTION
    )

    assert len(written.writes) == 2  # r1 once (its latest), r2 once
    assert written.refused == {"unknown_key": 1, "unsigned": 1, "misplaced": 1}
    table = entries_of(written.writes, keys)  # verified with the fleet's key: signed as events are
    expected = fold(parse_event(value) for value in values)
    assert {key: placeless(entry) for key, entry in table.items() if isinstance(entry, TableEntry)} == expected
    assert table["r1"] == kept.entries["r1"] and kept.entries["r1"].offset == 3  # its latest event's place
    # Read again (a keeper restarted before its commit): nothing changes, nothing is written.
    assert kept.fold(records(values, sign), keys, sign, datetime.now(UTC).timestamp(), RETENTION).writes == []


def test_an_entry_ended_past_its_retention_is_written_as_its_tombstone_and_forgotten() -> None:
    sign, keys = signer()
    old = (datetime.now(UTC) - timedelta(days=8)).isoformat()
    values = [event_bytes("accepted", "old", time=old), event_bytes("succeeded", "old", time=old)]
    values += [event_bytes("accepted", "running-long", time=old)]  # not ended: kept however old
    kept = KeptPartition(0)
    now = datetime.now(UTC).timestamp()
    written = kept.fold(records(values, sign), keys, sign, now, RETENTION)
    table = entries_of(written.writes, keys)
    assert table["old"] == Tombstone("old") and "old" not in kept.entries
    assert isinstance(table["running-long"], TableEntry) and set(kept.entries) == {"running-long"}

    fresh = KeptPartition(0)
    fresh.fold(records(values[:2], sign), keys, sign, now - 2 * DAY, RETENTION)  # folded when it was young
    assert set(fresh.entries) == {"old"}
    assert fresh.expired(now - 2 * DAY, RETENTION) == []
    assert fresh.expired(now, RETENTION) == [tombstone_write("old")] and fresh.entries == {}


def test_a_restore_keeps_the_newest_genuine_entry_and_writes_it_again_where_the_latest_record_is_not_it() -> None:
    sign, keys = signer()
    now = datetime.now(UTC).timestamp()
    kept = KeptPartition(0)
    first = kept.fold(records([event_bytes("accepted", f"r{n}") for n in range(5)], sign), keys, sign, now, RETENTION)
    genuine = dict(kept.entries)
    started = kept.fold(records([event_bytes("started", "r0")], sign, first=5), keys, sign, now, RETENTION)
    newest = kept.entries["r0"]
    forged_signer, _ = signer()
    forged_value = entry_value(genuine["r1"].model_copy(update={"state": "failed"}))
    other_partition = genuine["r4"].model_copy(update={"partition": 1})
    log = [
        *first.writes,
        *started.writes,
        first.writes[0],  # r0: its older entry replayed after its newest
        Write(b"r1", forged_value, signed(forged_value, forged_signer)),  # by a key not trusted
        Write(b"r2", entry_value(genuine["r2"]), []),  # unsigned
        tombstone_write("r3"),  # a tombstone of a request not ended: not the keepers'
        Write(b"r4", entry_value(other_partition), signed(entry_value(other_partition), sign)),  # of partition 1
        Write(b"nobody", b"not json", []),  # a key with no entry: nothing to write for it
    ]
    restoring = Restoring(0)
    restoring.take([state_record(write, offset) for offset, write in enumerate(log)], keys)
    restored = restoring.done(sign, now, RETENTION)

    assert restored.kept.entries == {**genuine, "r0": newest}
    assert restored.refused == {"unsigned": 2, "unknown_key": 1, "misplaced": 1}
    rewritten = entries_of(restored.writes, keys)
    assert rewritten == {key: restored.kept.entries[key] for key in ("r0", "r1", "r2", "r3", "r4")}

    # Restored again from the topic with the rewrites appended: every key's latest record is its entry.
    again = Restoring(0)
    again.take([state_record(write, offset) for offset, write in enumerate([*log, *restored.writes])], keys)
    assert again.done(sign, now, RETENTION).writes == []


def test_a_restore_reads_heads_and_an_entry_whose_events_are_of_another_version_starts_again_at_its_next_event() -> (
    None
):
    """A restore parses each entry's head, not its events (what the keeper holds until an event changes it). A genuine
    entry whose recent events this version cannot read (a later keeper's) is held by its head; its request's next event
    starts its entry again, as a restore that refused it did, and nothing fails."""
    sign, keys = signer()
    now = datetime.now(UTC).timestamp()
    kept = KeptPartition(0)
    kept.fold(records([event_bytes("accepted", "r0")], sign), keys, sign, now, RETENTION)
    document = json.loads(kept.held["r0"].value)
    document["recent"][0]["type"] = "a-type-of-a-later-version"
    later = json.dumps(document).encode()
    restoring = Restoring(0)
    restoring.take([state_record(Write(b"r0", later, signed(later, sign)), 0)], keys)
    restored = restoring.done(sign, now, RETENTION)
    assert restored.refused == {} and restored.kept.held["r0"].value == later and restored.kept.entries == {}

    written = restored.kept.fold(records([event_bytes("started", "r0")], sign, first=1), keys, sign, now, RETENTION)
    entry = restored.kept.entries["r0"]
    assert [write.key for write in written.writes] == [b"r0"]
    assert (entry.state, entry.events, [each.type for each in entry.recent]) == ("running", 1, ["started"])


def test_a_restore_forgets_an_entry_tombstoned_past_its_retention_and_tombstones_those_ended_since() -> None:
    sign, keys = signer()
    then = datetime.now(UTC).timestamp()
    kept = KeptPartition(0)
    values = [event_bytes("accepted", "a"), event_bytes("succeeded", "a"), event_bytes("accepted", "b")]
    values += [event_bytes("succeeded", "b")]
    written = kept.fold(records(values, sign), keys, sign, then, RETENTION)
    later = then + RETENTION + DAY
    log = [*written.writes, tombstone_write("a")]  # a's tombstone written by the keeper before: it stays gone
    restoring = Restoring(0)
    restoring.take([state_record(write, offset) for offset, write in enumerate(log)], keys)
    restored = restoring.done(sign, later, RETENTION)
    assert restored.kept.entries == {} and restored.writes == [tombstone_write("b")]


def test_an_entry_larger_than_a_record_may_be_is_written_with_fewer_recent_events_and_said() -> None:
    sign, keys = signer()
    big = {"note": "x" * 400_000}  # metadata is echoed in every event: three such events make an entry over 1 MiB
    values = [event_bytes(kind, "big", metadata=big) for kind in ("accepted", "started", "checkpoint")]
    kept = KeptPartition(0)
    written = kept.fold(records(values, sign), keys, sign, datetime.now(UTC).timestamp(), RETENTION)
    assert written.trimmed == ["big"] and len(written.writes) == 1
    assert written.writes[0].value is not None and len(written.writes[0].value) <= WRITTEN_MAX
    entry = read_entry(state_record(written.writes[0], 0), keys)
    assert (
        isinstance(entry, TableEntry) and entry.state == "running" and [e.type for e in entry.recent] == ["checkpoint"]
    )
    assert len(kept.entries["big"].recent) == 3  # the keeper's own entry is whole: only what is written is trimmed


def test_an_audit_writes_over_what_another_wrote_after_the_keepers_entries_and_nothing_else() -> None:
    sign, keys = signer()
    now = datetime.now(UTC).timestamp()
    kept = KeptPartition(0)
    written = kept.fold(records([event_bytes("accepted", f"r{n}") for n in range(3)], sign), keys, sign, now, RETENTION)
    consistent = Restoring(0)
    consistent.take([state_record(write, offset) for offset, write in enumerate(written.writes)], keys)
    assert consistent.audit(kept, sign) == []  # every key's latest record is the keeper's entry

    forged_signer, _ = signer()
    forged_value = entry_value(kept.entries["r1"].model_copy(update={"state": "failed"}))
    ended = KeptPartition(0, {key: entry for key, entry in kept.entries.items() if key != "r2"})  # r2 forgotten
    log = [*written.writes, Write(b"r1", forged_value, signed(forged_value, forged_signer))]
    audited = Restoring(0)
    audited.take([state_record(write, offset) for offset, write in enumerate(log)], keys)
    rewrites = audited.audit(ended, sign)
    assert entries_of(rewrites, keys) == {"r1": kept.entries["r1"], "r2": Tombstone("r2")}


def test_a_keeper_holds_its_entries_as_bytes_the_collector_does_not_walk_and_folds_them_as_objects() -> None:
    """Issue 59: a restored table held as objects (22,605 entries with their recent events: millions of objects) had
    each full garbage collection hold every thread 0.3 to 0.6 s while a daemon started. Held as bytes, each entry is
    one object the collector tracks, holding none; what an event changes is parsed, folded and held again."""
    sign, keys = signer()
    kept = KeptPartition(0)
    kinds = ("accepted", "started", "progress", "checkpoint")
    values = [
        event_bytes(kind, f"r{n}", **({"step": 1} if kind in ("progress", "checkpoint") else {}))
        for n in range(20)
        for kind in kinds
    ]
    now = datetime.now(UTC).timestamp()
    kept.fold(records(values, sign), keys, sign, now, RETENTION)
    gc.collect()
    inside = [each for held in kept.held.values() for each in gc.get_referents(held) if each is not type(held)]
    assert len(kept.held) == 20 and inside and not any(gc.is_tracked(each) for each in inside)
    assert {key: placeless(entry) for key, entry in kept.entries.items()} == {
        key: placeless(entry) for key, entry in fold(parse_event(value) for value in values).items()
    }
    more = kept.fold(
        records([event_bytes("failed", "r3", stage="train")], sign, first=len(values)), keys, sign, now, RETENTION
    )
    assert entries_of(more.writes, keys)["r3"].state == "failed" and kept.entries["r3"].events == 5  # type: ignore[union-attr]
