"""The keepers' seals without a broker (daemon/table/codec.py `Seal`, daemon/table/kept.py): one signature vouches for
the digests of a partition's entries as written; a reader takes an entry whose value a verified seal holds without
verifying it, and verifies every other; a seal is taken only whole, latest, signed by a trusted key and where its key
says; a keeper's digests follow its writes and tombstones, and a seal of fewer chunks removes the ones left over."""

from __future__ import annotations

import pytest

from daemon.table import codec, kept
from daemon.table.codec import Refused, Seal, TableEntry, digest, digest_text, is_seal, read_entry, read_seal, sealed
from daemon.table.kept import KeptPartition, Restoring, seal_writes
from schemas.signing import EventKeys
from tests.daemon.core.test_table_kept import RETENTION, event_bytes, records, signed, signer, state_record


def kept_partition(count: int, partition: int = 0) -> tuple[KeptPartition, list[kept.Write]]:
    """A partition whose keeper folded `count` accepted requests, and the writes it made."""
    sign, keys = signer()
    partition_kept = KeptPartition(partition)
    values = [event_bytes("accepted", f"req-{n:04d}") for n in range(count)]
    written = partition_kept.fold(records(values, sign, partition), keys, sign, 1e9, RETENTION)
    return partition_kept, written.writes


def counting(keys: EventKeys, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    verify = keys.verify

    def counted(value: bytes, headers: object) -> None:
        calls.append(1)
        verify(value, headers)  # type: ignore[arg-type]

    monkeypatch.setattr(keys, "verify", counted)
    return calls


def test_an_entry_a_verified_seal_holds_is_taken_unverified_and_any_other_bytes_are_verified(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sign, keys = signer()
    partition = KeptPartition(0)
    values = [event_bytes("accepted", f"req-{n}") for n in range(3)]
    writes = partition.fold(records(values, sign), keys, sign, 1e9, RETENTION).writes
    assert partition.unsealed and set(partition.digests) == {"req-0", "req-1", "req-2"}
    seal_records = [state_record(write, 10 + n) for n, write in enumerate(partition.seal(sign, "g1", 1e9))]
    assert not partition.unsealed and all(is_seal(record) for record in seal_records)
    found = [read_seal(record, keys) for record in seal_records]
    assert all(isinstance(each, Seal) for each in found)
    digests = sealed(each for each in found if isinstance(each, Seal))[0]
    calls = counting(keys, monkeypatch)
    entries = [read_entry(state_record(write, n), keys, digests[write.key.decode()]) for n, write in enumerate(writes)]
    assert all(isinstance(each, TableEntry) for each in entries) and not calls  # none verified one by one
    # A forged value under a sealed key: its digest is not the seal's, so it is verified, and refused.
    genuine = writes[0]
    assert genuine.value is not None
    forged = genuine.value.replace(b'"queued"', b'"succeeded"')
    assert forged != genuine.value
    other_sign, _ = signer()
    record = state_record(kept.Write(genuine.key, forged, signed(forged, other_sign)), 20)
    refused = read_entry(record, keys, digests["req-0"])
    assert isinstance(refused, Refused) and refused.reason == "unknown_key" and calls == [1]


def test_a_seal_is_taken_only_signed_by_a_trusted_key_under_its_own_key_and_partition() -> None:
    sign, keys = signer()
    partition, _ = kept_partition(2)
    write = partition.seal(sign, "g1", 1e9)[0]
    assert isinstance(read_seal(state_record(write, 0), keys), Seal)
    stranger, _ = signer()
    assert write.value is not None
    forged = kept.Write(write.key, write.value, signed(write.value, stranger))
    assert getattr(read_seal(state_record(forged, 0), keys), "reason", None) == "unknown_key"
    unsigned = kept.Write(write.key, write.value, [])
    assert getattr(read_seal(state_record(unsigned, 0), keys), "reason", None) == "unsigned"
    # A genuine seal written again in another partition, or under another chunk's key, vouches for nothing there.
    assert getattr(read_seal(state_record(write, 0, partition=1), keys), "reason", None) == "misplaced"
    moved = kept.Write(codec.seal_key(0, 1), write.value, write.headers)
    assert getattr(read_seal(state_record(moved, 0), keys), "reason", None) == "misplaced"
    malformed = kept.Write(write.key, b"{}", signed(b"{}", sign))
    assert getattr(read_seal(state_record(malformed, 0), keys), "reason", None) == "malformed"


def test_the_latest_whole_seal_is_taken_and_a_partial_or_older_one_is_not(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "SEAL_KEYS", 3)
    partition, _ = kept_partition(7)
    old = partition.seal(None, "old", 100.0)
    assert [write.key for write in old] == [codec.seal_key(0, n) for n in range(3)]  # 7 digests, 3 a record
    partition.digests = {key: partition.digests[key] for key in sorted(partition.digests)[:4]}
    new = partition.seal(None, "new", 200.0)
    # Two chunks now, and the third chunk of the old seal removed (its tombstone).
    assert [(write.key, write.value is None) for write in new] == [
        (codec.seal_key(0, 0), False),
        (codec.seal_key(0, 1), False),
        (codec.seal_key(0, 2), True),
    ]
    seals = [Seal.model_validate_json(write.value) for write in [*old, *new] if write.value is not None]
    newest = dict(partition.digests)
    assert sealed(seals)[0] == newest  # the newest, whole
    assert sealed([seal for seal in seals if not (seal.generation == "new" and seal.chunk == 1)])[0] != (
        newest
    )  # the newest lacks a chunk: the older whole one is taken
    assert sealed([seal for seal in seals if seal.chunk != 1]) == {}  # neither whole: none


def test_a_keepers_digests_follow_its_writes_tombstones_and_restores() -> None:
    sign, keys = signer()
    partition = KeptPartition(0)
    values = [event_bytes("accepted", "ends"), event_bytes("failed", "ends"), event_bytes("accepted", "runs")]
    writes = partition.fold(records(values, sign), keys, sign, 1e9, RETENTION).writes
    assert partition.digests == {write.key.decode(): digest(write.value or b"") for write in writes}
    partition.seal(sign, "g", 1e9)
    gone = partition.expired(4e9, RETENTION)  # in 2096: the failed one is past its retention
    assert [write.key for write in gone] == [b"ends"] and set(partition.digests) == {"runs"} and partition.unsealed
    # A restore skips the seal records and takes each entry's digest from its record's bytes.
    restoring = Restoring(0)
    seal = partition.seal(sign, "g2", 1e9)
    restoring.take([state_record(write, n) for n, write in enumerate([*writes, *seal])], keys)
    restored = restoring.done(sign, 1e9, RETENTION)
    assert restored.refused.total() == 0 and restored.kept.seal_chunks == 1
    assert restored.kept.digests == {write.key.decode(): digest(write.value or b"") for write in writes}


def test_seal_writes_split_the_digests_and_sign_each_record() -> None:
    sign, keys = signer()
    digests = {f"r{n}": digest(str(n).encode()) for n in range(5)}
    writes = seal_writes(2, digests, sign, "g", 1.0, 0)
    assert len(writes) == 1 and writes[0].key == b"~seal/2/0"
    taken = read_seal(state_record(writes[0], 0, partition=2), keys)
    assert isinstance(taken, Seal) and taken.digests == {key: digest_text(each) for key, each in digests.items()}
    assert taken.chunks == 1
