"""The entries of one events partition as its keeper holds them (daemon/table/keeper.py), with no Kafka in it: the
state partition's records restored into entries (`Restoring`), the events folded into them (`KeptPartition.fold`),
ended requests past their retention found (`KeptPartition.expired`). Each step is a function of its input, so it is
tested alone, and each takes a batch of records, so the keeper runs it in a worker thread (verifying, parsing,
folding and signing are the work in proportion to the topic, never done on the event loop).

Restoring keeps, per key, the entry with the highest place in the events topic (partition, offset): a genuine entry
written late (a keeper that lost its partition still writing) is never taken over a newer one. A record refused
(unsigned, a key not trusted, malformed, misplaced) is counted by reason and never taken; where a key's latest
record is not the entry kept (a forged or replayed record after it, a tombstone of a request not past its
retention), the entry kept is written again (`Restored.writes`), so that the compacted topic keeps it, not the
other record. The keeper reads its partitions so again every SWEEP_INTERVAL_S (`Restoring.audit`): a record written
by another while it keeps them is written over within minutes, before compaction can leave it alone.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from daemon.kafka.records import Record
from daemon.table.codec import (
    MAX_ENTRY_BYTES,
    MAX_SEAL_CHUNKS,
    SEAL_KEYS,
    SEAL_PREFIX,
    VERSION_HEADER,
    Refused,
    Seal,
    Tombstone,
    digest,
    entry_headers,
    entry_value,
    is_seal,
    read_entry,
    seal_key,
)
from daemon.table.entry import TableEntry, folded
from schemas import parse_event
from schemas.signing import EventKeys, EventSigner, UnverifiedEvent

# The largest entry written: the broker's default record limit (1 MiB and 12 bytes) less room for the key, the
# headers and the record's framing. An entry larger (a request whose latest events of each type are each near their
# own limit) is written with fewer of its recent events: its latest only, else none (`trimmed`, and said).
WRITTEN_MAX = MAX_ENTRY_BYTES - 16_384


@dataclass(frozen=True)
class Write:
    """A record of the state topic to write: an entry (its value and headers), or a tombstone (`value` None)."""

    key: bytes
    value: bytes | None
    headers: list[tuple[str, bytes]]


def entry_write(entry: TableEntry, signer: EventSigner | None) -> tuple[Write, bool]:
    """The entry as a signed record, and whether it was trimmed to fit WRITTEN_MAX (fewer recent events)."""
    value = entry_value(entry)
    trimmed = len(value) > WRITTEN_MAX
    for recent in (entry.recent[-1:], []):
        if len(value) <= WRITTEN_MAX:
            break
        value = entry_value(entry.model_copy(update={"recent": recent, "earlier": []}))
    headers = [(name, header) for name, header in entry_headers(value, signer) if header is not None]
    return Write(entry.request_id.encode(), value, headers), trimmed


def seal_writes(
    partition: int, digests: Mapping[str, str], signer: EventSigner | None, generation: str, now: float, before: int
) -> list[Write]:
    """A partition's seal of `digests` (each entry's value's, as written), SEAL_KEYS a record, signed; and the
    tombstones of the chunks of its seal `before` (how many it had) that this one has not."""
    ids = sorted(digests)
    chunks = max(1, -(-len(ids) // SEAL_KEYS))
    writes = []
    for chunk in range(chunks):
        seal = Seal(
            partition=partition,
            generation=generation,
            sealed_at=now,
            chunk=chunk,
            chunks=chunks,
            digests={each: digests[each] for each in ids[chunk * SEAL_KEYS : (chunk + 1) * SEAL_KEYS]},
        )
        value = seal.model_dump_json().encode()
        headers = [(name, header) for name, header in entry_headers(value, signer) if header is not None]
        writes.append(Write(seal_key(partition, chunk), value, headers))
    gone = [Write(seal_key(partition, chunk), None, [(VERSION_HEADER, b"1")]) for chunk in range(chunks, before)]
    return writes + gone


def tombstone_write(request_id: str) -> Write:
    return Write(request_id.encode(), None, [(VERSION_HEADER, b"1")])


def expired(entry: TableEntry, now: float, retention_s: float) -> bool:
    """Ended for longer than the retention, by its latest event's time."""
    return entry.ended and entry.last.timestamp() < now - retention_s


@dataclass
class Written:
    """What a batch changed: the records to write (entries changed, tombstones of entries ended past retention),
    the events refused by why, and the entries written trimmed (request ids)."""

    writes: list[Write] = field(default_factory=list)
    refused: Counter[str] = field(default_factory=Counter)
    trimmed: list[str] = field(default_factory=list)


class KeptPartition:
    """The entries of the requests whose events are in events partition `partition`."""

    def __init__(
        self, partition: int, entries: dict[str, TableEntry] | None = None, digests: dict[str, str] | None = None
    ) -> None:
        self.partition = partition
        self.entries: dict[str, TableEntry] = entries if entries is not None else {}
        # Each entry's value's digest, as last written (or restored): what the partition's seal vouches for.
        self.digests: dict[str, str] = digests if digests is not None else {}
        self.unsealed = True  # written since its last seal (or never sealed)
        self.seal_chunks = 0  # the chunks of its last seal

    def wrote(self, writes: Sequence[Write]) -> None:
        """Writes of this partition's entries (or tombstones) made: the digests follow them."""
        for write in writes:
            if is_seal_key(write.key):
                continue
            request_id = write.key.decode()
            if write.value is None:
                self.digests.pop(request_id, None)
            else:
                self.digests[request_id] = digest(write.value)
            self.unsealed = True

    def fold(
        self,
        records: Sequence[Record],
        keys: EventKeys | None,
        signer: EventSigner | None,
        now: float,
        retention_s: float,
    ) -> Written:
        """Fold a batch of this partition's event records (verified when there are `keys`, and under their own
        request's key, as `EventStream` reads them); the records that write what changed, each request's latest
        state once. An entry that is already ended past its retention is written as its tombstone and forgotten."""
        written = Written()
        changed: dict[str, TableEntry] = {}
        for record in records:
            value = record.value or b""
            if keys is not None:
                try:
                    keys.verify(value, record.headers)
                except UnverifiedEvent as exc:
                    written.refused[exc.reason] += 1
                    continue
            try:
                event = parse_event(value)
            except (ValidationError, ValueError):
                written.refused["malformed"] += 1
                continue
            if event.request_id is None:
                continue
            if record.key != event.request_id.encode():
                # A genuine event of another request written again under this key (the readers refuse it too): a
                # reader of its own request's partition would never see it.
                written.refused["misplaced"] += 1
                continue
            entry = folded(self.entries.get(event.request_id), event, self.partition, record.offset)
            if entry is not None:
                self.entries[entry.request_id] = changed[entry.request_id] = entry
        for request_id, entry in changed.items():
            if expired(entry, now, retention_s):
                del self.entries[request_id]
                written.writes.append(tombstone_write(request_id))
                continue
            write, trimmed = entry_write(entry, signer)
            written.writes.append(write)
            if trimmed:
                written.trimmed.append(request_id)
        self.wrote(written.writes)
        return written

    def expired(self, now: float, retention_s: float) -> list[Write]:
        """The tombstones of the entries ended past their retention, which are forgotten."""
        gone = [request_id for request_id, entry in self.entries.items() if expired(entry, now, retention_s)]
        for request_id in gone:
            del self.entries[request_id]
        writes = [tombstone_write(request_id) for request_id in gone]
        self.wrote(writes)
        return writes

    def seal(self, signer: EventSigner | None, generation: str, now: float) -> list[Write]:
        """The partition's seal of its entries as written now (`seal_writes`)."""
        writes = seal_writes(self.partition, self.digests, signer, generation, now, self.seal_chunks)
        self.seal_chunks = sum(1 for write in writes if write.value is not None)
        self.unsealed = False
        return writes


@dataclass
class Restored:
    """A state partition restored: its entries, what to write so that the compacted topic keeps them (entries
    written again, tombstones of entries past retention), and the records refused by why."""

    kept: KeptPartition
    writes: list[Write]
    refused: Counter[str]
    trimmed: list[str]


class Restoring:
    """A state partition read from its beginning, batch by batch (`take`), into its entries (`done`)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.kept: dict[str, TableEntry] = {}
        self.digests: dict[str, str] = {}  # the digest of each kept entry's record's value
        self.seal_chunks = 0  # the chunks of the seal found (its records are the keeper's own, written again)
        self.stale: set[str] = set()  # keys whose latest record is not the entry kept: it is written again
        self.tombstoned: set[str] = set()  # keys whose latest record is a tombstone
        self.refused: Counter[str] = Counter()
        self.read = 0  # records read, tombstones and refused ones included

    def take(self, records: Sequence[Record], keys: EventKeys | None) -> None:
        for record in records:
            self.read += 1
            if is_seal(record):
                if record.value is not None:
                    self.seal_chunks = max(self.seal_chunks, _seal_chunk(record.key) + 1)
                continue
            found = read_entry(record, keys)
            if isinstance(found, TableEntry) and found.partition != self.partition:
                # A keeper writes the entries of events partition p to state partition p only: this one is a
                # genuine entry written again where it does not belong.
                found = Refused("misplaced", f"an entry of events partition {found.partition} in {self.partition}")
            if isinstance(found, Refused):
                self.refused[found.reason] += 1
                key = (record.key or b"").decode("utf-8", errors="replace")
                if key in self.kept:  # only keys with an entry matter: memory stays bounded by the entries
                    self.stale.add(key)
                    self.tombstoned.discard(key)
                continue
            if isinstance(found, Tombstone):
                if found.request_id in self.kept:
                    self.tombstoned.add(found.request_id)
                    self.stale.discard(found.request_id)
                continue
            key = found.request_id
            self.tombstoned.discard(key)
            kept = self.kept.get(key)
            if kept is None or (found.partition, found.offset) > (kept.partition, kept.offset):
                self.kept[key] = found
                self.digests[key] = digest(record.value or b"")
                self.stale.discard(key)
            elif found == kept:
                self.stale.discard(key)  # the same entry written again: what the topic keeps is right
            else:
                self.stale.add(key)  # an older entry after the newest: a replay, or a late keeper's

    def done(self, signer: EventSigner | None, now: float, retention_s: float) -> Restored:
        writes: list[Write] = []
        trimmed: list[str] = []
        for key in self.tombstoned:
            if not expired(self.kept[key], now, retention_s):
                self.stale.add(key)  # a tombstone of a request not past its retention: not the keepers'
            else:
                del self.kept[key]  # tombstoned already: nothing to write
        kept = KeptPartition(self.partition, self.kept, {key: self.digests[key] for key in self.kept})
        kept.seal_chunks = self.seal_chunks
        gone = kept.expired(now, retention_s)
        for key in sorted(self.stale):
            if key in kept.entries:
                write, cut = entry_write(kept.entries[key], signer)
                writes.append(write)
                if cut:
                    trimmed.append(key)
        kept.wrote(writes)
        return Restored(kept, [*writes, *gone], self.refused, trimmed)

    def audit(self, kept: KeptPartition, signer: EventSigner | None) -> list[Write]:
        """The writes that make each key's latest record in the state partition read (this restoring's) what `kept`
        holds now: its entry where the latest record is another (forged, replayed, an older one), a tombstone where
        the latest is a genuine entry of a request `kept` no longer holds. An entry changed since the read is written
        again too, harmlessly (it is the entry)."""
        writes = [
            entry_write(entry, signer)[0]
            for key, entry in kept.entries.items()
            if key in self.stale or key in self.tombstoned or self.kept.get(key) != entry
        ]
        writes += [tombstone_write(key) for key in self.kept if key not in kept.entries and key not in self.tombstoned]
        kept.wrote(writes)
        return writes


def is_seal_key(key: bytes) -> bool:
    return key.startswith(SEAL_PREFIX)


def _seal_chunk(key: bytes | None) -> int:
    """The chunk number a seal's key names (0 for one that names none: its records are written over anyway)."""
    number = (key or b"").rpartition(b"/")[2]
    return min(int(number), MAX_SEAL_CHUNKS - 1) if number.isdigit() and len(number) <= 6 else 0
