"""An entry of the table of requests as a record of the state topic, and a record back as an entry: signed by the
keeper's host with the fleet's event key, and taken only when a trusted key signed exactly its bytes, as events are
(schemas/signing.py). Its key is the request id; a null value is the request's tombstone.

A seal (`Seal`) vouches for many entries with one signature: the SHA-256 of each entry's value the keeper of a
partition wrote, in records keyed `~seal/<partition>/<chunk>` beside the entries (never a request id: they have no
`~`). An Ed25519 verification costs ~120 µs here, a SHA-256 of an entry ~3 µs: a reader of the whole table (`adapterd
jobs`, a fleet host's view) verifies the partitions' seals and takes each entry whose value's digest a seal holds,
verifying only the entries written since (each is signed too). A seal says only "these bytes are an entry a keeper
wrote", which each entry's own signature says: it trusts nothing more than they do.

A record that is not an entry is refused with its reason, never taken: unsigned or signed by a key not trusted,
bytes that are not an entry of this version (`malformed`), or an entry of another request than its key names
(`misplaced`: a genuine entry written again under another key).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from daemon.kafka.records import Record
from daemon.table.entry import EntryHead, TableEntry
from schemas.signing import SIGNATURE_HEADER, EventKeys, EventSigner, UnverifiedEvent

Entry = TypeVar("Entry", bound=EntryHead)

VERSION_HEADER = "adapterd-table-version"
MAX_ENTRY_BYTES = 1_048_576  # what the state topic's records may be at most (the broker's default): larger is refused
SEAL_PREFIX = b"~seal/"  # a seal's key: `~seal/<partition>/<chunk>`
# The digests of one seal record: 4,000 x (a request id of 128 characters, a digest of 44, JSON's quotes and commas)
# is ~720 KB, under MAX_ENTRY_BYTES.
SEAL_KEYS = 4_000
MAX_SEAL_CHUNKS = 1_000  # 4 million entries a partition: a seal saying more is refused as malformed


@dataclass(frozen=True)
class Tombstone:
    """A request removed from the table (its key's null value)."""

    request_id: str


@dataclass(frozen=True)
class Refused:
    """A record of the state topic not taken, and why (UnverifiedEvent's reasons, `malformed`, `misplaced`)."""

    reason: str
    detail: str


class Seal(BaseModel):
    """One record of a partition's seal: chunk `chunk` of `chunks` of the digests its keeper vouched for at
    `sealed_at`, all the chunks of one seal sharing its `generation`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    partition: int = Field(ge=0)
    generation: str = Field(max_length=64)
    sealed_at: float
    chunk: int = Field(ge=0)
    chunks: int = Field(ge=1, le=MAX_SEAL_CHUNKS)
    digests: dict[str, str] = Field(description="request id → the base64 SHA-256 of its entry's value")


def digest(value: bytes) -> bytes:
    """What a seal holds of an entry's value: its SHA-256 (in the seal's record, as base64)."""
    return hashlib.sha256(value).digest()


def digest_text(each: bytes) -> str:
    """A digest as a seal's record says it."""
    return base64.b64encode(each).decode()


def seal_key(partition: int, chunk: int) -> bytes:
    return SEAL_PREFIX + f"{partition}/{chunk}".encode()


def is_seal(record: Record) -> bool:
    return (record.key or b"").startswith(SEAL_PREFIX)


def read_seal(record: Record, keys: EventKeys) -> Seal | Tombstone | Refused:
    """A seal record as a reader takes it: verified, and only where its key and partition are its own."""
    if record.value is None:
        return Tombstone((record.key or b"").decode("utf-8", errors="replace"))
    if len(record.value) > MAX_ENTRY_BYTES:
        return Refused("malformed", f"a seal of {len(record.value)} bytes, above {MAX_ENTRY_BYTES}")
    try:
        keys.verify(record.value, record.headers)
    except UnverifiedEvent as exc:
        return Refused(exc.reason, str(exc))
    try:
        seal = Seal.model_validate_json(record.value)
    except ValidationError as exc:
        return Refused("malformed", f"not a seal of version 1: {exc.error_count()} error(s)")
    if record.key != seal_key(seal.partition, seal.chunk) or record.partition != seal.partition:
        return Refused("misplaced", f"a seal of partition {seal.partition} under {record.key!r:.80}")
    return seal


def sealed(seals: Iterable[Seal]) -> dict[int, dict[str, bytes]]:
    """Partition → request id → its entry's digest (decoded), as each partition's latest whole seal says (every chunk
    of its generation read; an older seal's chunks left behind by one of fewer chunks are not of it)."""
    by_generation: dict[tuple[int, str], list[Seal]] = {}
    for seal in seals:
        by_generation.setdefault((seal.partition, seal.generation), []).append(seal)
    latest: dict[int, list[Seal]] = {}
    for (partition, _), chunks in by_generation.items():
        whole = {seal.chunk for seal in chunks if seal.chunks == chunks[0].chunks} == set(range(chunks[0].chunks))
        if whole and (partition not in latest or chunks[0].sealed_at > latest[partition][0].sealed_at):
            latest[partition] = chunks
    return {
        partition: {request_id: _decoded(each) for seal in chunks for request_id, each in seal.digests.items()}
        for partition, chunks in latest.items()
    }


def _decoded(each: str) -> bytes:
    try:
        return base64.b64decode(each, validate=True)
    except ValueError:
        return b""  # no value's digest: its entry is verified


def entry_value(entry: TableEntry) -> bytes:
    return entry.model_dump_json().encode()


def entry_headers(value: bytes, signer: EventSigner | None) -> list[tuple[str, bytes]]:
    """The headers of an entry (or a seal) whose record value is exactly `value`: its version, and the host's
    signature where it signs."""
    signature = [(SIGNATURE_HEADER, signer.sign(value))] if signer else []
    return [(VERSION_HEADER, b"1"), *signature]


def read_entry(
    record: Record, keys: EventKeys | None, sealed_as: bytes | None = None
) -> TableEntry | Tombstone | Refused:
    """The record as the table takes it: an entry (verified when there are `keys`, unless its value's digest is
    `sealed_as`, what a verified seal holds of its key), a tombstone, or refused."""
    return _read(record, keys, sealed_as, TableEntry)


def read_head(
    record: Record, keys: EventKeys | None, sealed_as: bytes | None = None
) -> EntryHead | Tombstone | Refused:
    """`read_entry` for a reader that lists the requests (`adapterd jobs`): the entry's events skipped, not parsed (a
    fifth of the parse). Its bytes are verified all the same."""
    return _read(record, keys, sealed_as, Head)


class Head(EntryHead):
    """An entry read as its head (`read_head`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")  # an entry's `recent` and `earlier`, skipped


def _read(
    record: Record, keys: EventKeys | None, sealed_as: bytes | None, model: type[Entry]
) -> Entry | Tombstone | Refused:
    found, value_digest = parsed(record, model)
    if isinstance(found, Refused) and not value_digest:
        return found  # larger than a record may be: not hashed, not verified
    if keys is not None and not isinstance(found, Tombstone) and record.value is not None:
        if sealed_as is None or value_digest != sealed_as:
            refused = unverified(record, keys)
            if refused is not None:
                return refused
    return found


def parsed(record: Record, model: type[Entry]) -> tuple[Entry | Tombstone | Refused, bytes]:
    """The record parsed, not verified (`unverified` says whether a trusted key signed it), and its value's SHA-256
    (what a seal holds of it); a reader parses as the records come and verifies once it has read the seals."""
    key = (record.key or b"").decode("utf-8", errors="replace")
    if record.value is None:
        return Tombstone(key), b""
    if len(record.value) > MAX_ENTRY_BYTES:
        return Refused("malformed", f"{len(record.value)} bytes, above {MAX_ENTRY_BYTES}"), b""
    value_digest = digest(record.value)
    try:
        entry = model.model_validate_json(record.value)
    except ValidationError as exc:
        why = f"not an entry of version 1: {exc.error_count()} error(s), first: {exc.errors()[0]['msg']}"
        return Refused("malformed", why), value_digest
    if entry.request_id != key:
        return Refused("misplaced", f"the entry of {entry.request_id[:80]!r} under the key {key[:80]!r}"), value_digest
    return entry, value_digest


def unverified(record: Record, keys: EventKeys) -> Refused | None:
    """Why no trusted key signed exactly the record's value; None when one did."""
    try:
        keys.verify(record.value or b"", record.headers)
    except UnverifiedEvent as exc:
        return Refused(exc.reason, str(exc))
    return None
