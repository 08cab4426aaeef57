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
from typing import NamedTuple

from pydantic import ValidationError

from daemon.kafka.event_reader import checked, misplaced
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
    digest_text,
    entry_headers,
    entry_value,
    is_seal,
    read_head,
    seal_key,
)
from daemon.table.entry import EntryHead, TableEntry, folded
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


class Held(NamedTuple):
    """An entry as its keeper holds it between its events: its bytes (whole, as `entry_value` makes them, or as read
    back), its place and what the sweep reads of it; parsed only when an event changes it. One object the garbage
    collector tracks, holding none: the entries as objects (a restored table of 22,605, each with its recent events)
    were millions, and each full collection while they loaded held every thread 0.3 to 0.6 s
    (benchmarks.fleet_scale)."""

    value: bytes
    partition: int
    offset: int
    ended: bool
    last: float  # its latest event's time, epoch seconds

    @classmethod
    def of(cls, entry: EntryHead, value: bytes) -> Held:
        return cls(value, entry.partition, entry.offset, entry.ended, entry.last.timestamp())

    def entry(self) -> TableEntry | None:
        """The entry, parsed whole (its bytes were verified, or made here); None where its head was read but not its
        events (a restore reads heads): a genuine entry of another version, whose events the next one starts again."""
        try:
            return TableEntry.model_validate_json(self.value)
        except ValidationError:
            return None


def entry_write(entry: TableEntry, signer: EventSigner | None, value: bytes | None = None) -> tuple[Write, bool]:
    """The entry (whose `entry_value` is `value`, when known) as a signed record, and whether it was trimmed to fit
    WRITTEN_MAX (fewer recent events)."""
    value = entry_value(entry) if value is None else value
    trimmed = len(value) > WRITTEN_MAX
    for recent in (entry.recent[-1:], []):
        if len(value) <= WRITTEN_MAX:
            break
        value = entry_value(entry.model_copy(update={"recent": recent, "earlier": []}))
    return signed_write(entry.request_id, value, signer), trimmed


def signed_write(request_id: str, value: bytes, signer: EventSigner | None) -> Write:
    """An entry's bytes as a signed record (a held entry written again: no parse, no dump)."""
    return Write(request_id.encode(), value, entry_headers(value, signer))


def seal_writes(
    partition: int, digests: Mapping[str, bytes], signer: EventSigner | None, generation: str, now: float, before: int
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
            digests={each: digest_text(digests[each]) for each in ids[chunk * SEAL_KEYS : (chunk + 1) * SEAL_KEYS]},
        )
        value = seal.model_dump_json().encode()
        writes.append(Write(seal_key(partition, chunk), value, entry_headers(value, signer)))
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
    """The entries of the requests whose events are in events partition `partition`, held as their bytes (`Held`)."""

    def __init__(
        self,
        partition: int,
        entries: Mapping[str, TableEntry] | None = None,
        digests: dict[str, bytes] | None = None,
        held: dict[str, Held] | None = None,
    ) -> None:
        self.partition = partition
        self.held: dict[str, Held] = held if held is not None else {}
        # Each entry's value's digest, as last written (or restored): what the partition's seal vouches for.
        self.digests: dict[str, bytes] = digests if digests is not None else {}
        for request_id, entry in (entries or {}).items():  # entries given: held as if written whole
            value = entry_value(entry)
            self.held[request_id] = Held.of(entry, value)
            self.digests.setdefault(request_id, digest(value))
        self.unsealed = True  # written since its last seal (or never sealed)
        self.seal_chunks = 0  # the chunks of its last seal

    @property
    def entries(self) -> dict[str, TableEntry]:
        """Every entry held, parsed (what a test compares; the keeper parses only what an event changes)."""
        return {request_id: entry for request_id, held in self.held.items() if (entry := held.entry()) is not None}

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
        changed: dict[str, TableEntry] = {}  # each request changed, parsed once a batch
        for record in records:
            event = checked(record, keys)
            if isinstance(event, UnverifiedEvent):
                written.refused[event.reason] += 1
                continue
            if isinstance(event, ValueError):
                written.refused["malformed"] += 1
                continue
            if event.request_id is None:
                continue
            if misplaced(record, event):  # the readers refuse it too
                written.refused["misplaced"] += 1
                continue
            request_id = event.request_id
            held = self.held.get(request_id)
            before = changed[request_id] if request_id in changed else (None if held is None else held.entry())
            entry = folded(before, event, self.partition, record.offset)
            if entry is not None:
                changed[request_id] = entry
        for request_id, entry in changed.items():
            if expired(entry, now, retention_s):
                self.held.pop(request_id, None)
                written.writes.append(tombstone_write(request_id))
                continue
            value = entry_value(entry)
            self.held[request_id] = Held.of(entry, value)
            write, trimmed = entry_write(entry, signer, value)
            written.writes.append(write)
            if trimmed:
                written.trimmed.append(request_id)
        self.wrote(written.writes)
        return written

    def expired(self, now: float, retention_s: float) -> list[Write]:
        """The tombstones of the entries ended past their retention, which are forgotten."""
        gone = [request_id for request_id, held in self.held.items() if held.ended and held.last < now - retention_s]
        for request_id in gone:
            del self.held[request_id]
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


class Restoring:
    """A state partition read from its beginning, batch by batch (`take`), into its entries (`done`)."""

    def __init__(self, partition: int) -> None:
        self.partition = partition
        self.held: dict[str, Held] = {}  # each key's entry kept, as its record's bytes
        self.digests: dict[str, bytes] = {}  # the digest of each kept entry's record's value
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
            found = read_head(record, keys)  # what the keeper holds of an entry: parsed whole where an event changes it
            if isinstance(found, EntryHead) and found.partition != self.partition:
                # A keeper writes the entries of events partition p to state partition p only: this one is a
                # genuine entry written again where it does not belong.
                found = Refused("misplaced", f"an entry of events partition {found.partition} in {self.partition}")
            if isinstance(found, Refused):
                self.refused[found.reason] += 1
                key = (record.key or b"").decode("utf-8", errors="replace")
                if key in self.held:  # only keys with an entry matter: memory stays bounded by the entries
                    self.stale.add(key)
                    self.tombstoned.discard(key)
                continue
            if isinstance(found, Tombstone):
                if found.request_id in self.held:
                    self.tombstoned.add(found.request_id)
                    self.stale.discard(found.request_id)
                continue
            key, value = found.request_id, record.value or b""
            self.tombstoned.discard(key)
            kept = self.held.get(key)
            if kept is None or (found.partition, found.offset) > (kept.partition, kept.offset):
                self.held[key] = Held.of(found, value)
                self.digests[key] = digest(value)
                self.stale.discard(key)
            elif value == kept.value:
                self.stale.discard(key)  # the same entry written again: what the topic keeps is right
            else:
                self.stale.add(key)  # an older entry after the newest: a replay, or a late keeper's

    def done(self, signer: EventSigner | None, now: float, retention_s: float) -> Restored:
        for key in self.tombstoned:
            held = self.held[key]
            if not (held.ended and held.last < now - retention_s):
                self.stale.add(key)  # a tombstone of a request not past its retention: not the keepers'
            else:
                del self.held[key]  # tombstoned already: nothing to write
        kept = KeptPartition(self.partition, digests={key: self.digests[key] for key in self.held}, held=self.held)
        kept.seal_chunks = self.seal_chunks
        gone = kept.expired(now, retention_s)
        writes = [signed_write(key, kept.held[key].value, signer) for key in sorted(self.stale) if key in kept.held]
        kept.wrote(writes)
        return Restored(kept, [*writes, *gone], self.refused)

    def audit(self, kept: KeptPartition, signer: EventSigner | None) -> list[Write]:
        """The writes that make each key's latest record in the state partition read (this restoring's) what `kept`
        holds now: its entry where the latest record is another (forged, replayed, an older one: its digest is not
        the one the keeper wrote), a tombstone where the latest is a genuine entry of a request `kept` no longer
        holds. An entry changed since the read is written again too, harmlessly (it is the entry)."""
        writes = [
            signed_write(key, held.value, signer)
            for key, held in kept.held.items()
            if key in self.stale or key in self.tombstoned or self.digests.get(key) != kept.digests.get(key)
        ]
        writes += [tombstone_write(key) for key in self.held if key not in kept.held and key not in self.tombstoned]
        kept.wrote(writes)
        return writes


def is_seal_key(key: bytes) -> bool:
    return key.startswith(SEAL_PREFIX)


def _seal_chunk(key: bytes | None) -> int:
    """The chunk number a seal's key names (0 for one that names none: its records are written over anyway)."""
    number = (key or b"").rpartition(b"/")[2]
    return min(int(number), MAX_SEAL_CHUNKS - 1) if number.isdigit() and len(number) <= 6 else 0
