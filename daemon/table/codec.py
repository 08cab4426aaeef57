"""An entry of the table of requests as a record of the state topic, and a record back as an entry: signed by the
keeper's host with the fleet's event key, and taken only when a trusted key signed exactly its bytes, as events are
(schemas/signing.py). Its key is the request id; a null value is the request's tombstone.

A record that is not an entry is refused with its reason, never taken: unsigned or signed by a key not trusted,
bytes that are not an entry of this version (`malformed`), or an entry of another request than its key names
(`misplaced`: a genuine entry written again under another key).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from daemon.kafka.records import Record
from daemon.table.entry import TableEntry
from schemas.signing import SIGNATURE_HEADER, EventKeys, EventSigner, UnverifiedEvent

VERSION_HEADER = "adapterd-table-version"
MAX_ENTRY_BYTES = 1_048_576  # what the state topic's records may be at most (the broker's default): larger is refused


@dataclass(frozen=True)
class Tombstone:
    """A request removed from the table (its key's null value)."""

    request_id: str


@dataclass(frozen=True)
class Refused:
    """A record of the state topic not taken, and why (UnverifiedEvent's reasons, `malformed`, `misplaced`)."""

    reason: str
    detail: str


def entry_value(entry: TableEntry) -> bytes:
    return entry.model_dump_json().encode()


def entry_headers(value: bytes, signer: EventSigner | None) -> list[tuple[str, bytes | None]]:
    """The headers of an entry whose record value is exactly `value`: its version, and the host's signature."""
    signature: list[tuple[str, bytes | None]] = [(SIGNATURE_HEADER, signer.sign(value))] if signer else []
    return [(VERSION_HEADER, b"1"), *signature]


def read_entry(record: Record, keys: EventKeys | None) -> TableEntry | Tombstone | Refused:
    """The record as the table takes it: an entry (verified when there are `keys`), a tombstone, or refused."""
    key = (record.key or b"").decode("utf-8", errors="replace")
    if record.value is None:
        return Tombstone(key)
    if len(record.value) > MAX_ENTRY_BYTES:
        return Refused("malformed", f"{len(record.value)} bytes, above {MAX_ENTRY_BYTES}")
    if keys is not None:
        try:
            keys.verify(record.value, record.headers)
        except UnverifiedEvent as exc:
            return Refused(exc.reason, str(exc))
    try:
        entry = TableEntry.model_validate_json(record.value)
    except ValidationError as exc:
        return Refused(
            "malformed", f"not an entry of version 1: {exc.error_count()} error(s), first: {exc.errors()[0]['msg']}"
        )
    if entry.request_id != key:
        return Refused("misplaced", f"the entry of {entry.request_id[:80]!r} under the key {key[:80]!r}")
    return entry
