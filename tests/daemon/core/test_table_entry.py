"""The table of requests' entry (daemon/table/entry.py) and its record (daemon/table/codec.py), without a broker:
the one fold of an event into a request's state, folded once whatever repeats it, and an entry taken only as an
event is, signed by a trusted key over exactly its bytes and under its own request's key."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest

from daemon.table.codec import Refused, Tombstone, entry_headers, entry_value, read_entry
from daemon.table.entry import KEPT_IDS, TableEntry, folded
from schemas import Event, parse_event
from schemas.signing import EventKeys, EventSigner, new_key_pair, read_private_key
from testbed.memory_kafka import FakeRecord
from tests.helpers import event_document


def event(kind: str, **fields: Any) -> Event:
    """An event of the request r1 as docs/events.md shows it, with an id of its own (the examples share theirs)."""
    fields = {"request_id": "r1", "host": "h1", "event_id": secrets.token_hex(16), **fields}
    return parse_event(json.dumps(event_document(kind, **fields)).encode())


def fold_all(events: list[tuple[Event, int]]) -> TableEntry | None:
    entry = None
    for each, offset in events:
        entry = folded(entry, each, 0, offset) or entry
    return entry


def test_an_entry_follows_a_requests_lifecycle_and_keeps_the_latest_event_of_each_type() -> None:
    entry = fold_all(
        [
            (event("accepted", attempt=1), 10),
            (event("started"), 11),
            (event("progress", step=1), 12),
            (event("progress", step=2), 13),
            (event("succeeded"), 14),
        ]
    )
    assert entry is not None
    assert (entry.state, entry.method, entry.events, entry.offset, entry.latest) == (
        "succeeded",
        "sft",
        5,
        14,
        "succeeded",
    )
    assert [e.type for e in entry.recent] == ["accepted", "started", "progress", "succeeded"]
    assert [e.step for e in entry.recent if e.type == "progress"] == [2]


def test_an_event_is_folded_once_by_its_id_or_its_place_in_the_events_topic() -> None:
    accepted, started = event("accepted"), event("started")
    entry = folded(folded(None, accepted, 0, 5), started, 0, 6)
    assert entry is not None and entry.events == 2
    assert folded(entry, started, 0, 99) is None  # the same event written again, later in the topic
    assert folded(entry, event("progress"), 0, 6) is None  # read again from before the entry's offset
    # A topic given more partitions: the request's later events are elsewhere, at offsets of their own.
    moved = folded(entry, event("progress"), 3, 2)
    assert moved is not None and (moved.partition, moved.offset, moved.state) == (3, 2, "running")


def test_an_ended_request_accepted_again_starts_afresh_and_a_duplicate_success_only_counts() -> None:
    done = fold_all([(event("accepted"), 1), (event("succeeded"), 2)])
    again = folded(done, event("succeeded", duplicate=True), 0, 3)
    assert again is not None and (again.state, again.events, again.latest) == ("succeeded", 3, "succeeded")
    anew = folded(done, event("accepted", attempt=1, time="2030-01-01T00:00:00Z"), 0, 4)
    assert anew is not None and (anew.state, anew.events, anew.since.year) == ("queued", 1, 2030)


def test_an_entry_keeps_a_bounded_number_of_ids() -> None:
    entry = None
    for offset in range(KEPT_IDS + 10):
        entry = folded(entry, event("progress", step=offset), 0, offset) or entry
    assert entry is not None and len(entry.ids) == KEPT_IDS and entry.events == KEPT_IDS + 10


def signed_record(entry: TableEntry, signer: EventSigner | None, key: bytes | None = None) -> FakeRecord:
    value = entry_value(entry)
    return FakeRecord("adapterd.state", 0, 0, key or entry.request_id.encode(), value, entry_headers(value, signer))


@pytest.fixture
def keys() -> tuple[EventSigner, EventKeys]:
    pem, public = new_key_pair()
    return EventSigner(read_private_key(pem)), EventKeys.parse([public])


def test_an_entry_is_taken_when_a_trusted_key_signed_it_and_refused_naming_why_otherwise(keys: Any) -> None:
    signer, trusted = keys
    entry = fold_all([(event("accepted"), 1)])
    assert entry is not None
    assert read_entry(signed_record(entry, signer), trusted) == entry
    stranger = EventSigner(read_private_key(new_key_pair()[0]))
    forged = read_entry(signed_record(entry, stranger), trusted)
    assert isinstance(forged, Refused) and forged.reason == "unknown_key"
    unsigned = read_entry(signed_record(entry, None), trusted)
    assert isinstance(unsigned, Refused) and unsigned.reason == "unsigned"
    tampered = signed_record(entry, signer)
    tampered = FakeRecord(
        tampered.topic,
        0,
        0,
        tampered.key,
        (tampered.value or b"").replace(b'"queued"', b'"succeeded"'),
        tampered.headers,
    )
    refused = read_entry(tampered, trusted)
    assert isinstance(refused, Refused) and refused.reason == "bad_signature"
    misplaced = read_entry(signed_record(entry, signer, key=b"another"), trusted)
    assert isinstance(misplaced, Refused) and misplaced.reason == "misplaced"
    value = b"not json"
    junk = read_entry(FakeRecord("t", 0, 0, b"r1", value, entry_headers(value, signer)), trusted)
    assert isinstance(junk, Refused) and junk.reason == "malformed"
    assert read_entry(FakeRecord("t", 0, 0, b"r1", None), trusted) == Tombstone("r1")
    assert read_entry(signed_record(entry, None), None) == entry  # a reader without keys reads unverified


def test_a_request_accepted_again_keeps_its_earlier_success_for_the_fleets_durations() -> None:
    """Redelivered after its success, a request is accepted again and answered from that success (`duplicate`): its
    entry's state starts again, but the success that trained stays among its recent events, which the fleet's view
    folds into the durations it expects jobs to take."""
    first = event("succeeded")
    done = fold_all([(event("accepted"), 1), (event("started"), 2), (first, 3)])
    again = fold_all([(event("accepted"), 4), (event("succeeded", duplicate=True), 5)])
    assert done is not None and again is not None
    entry = done
    for each, offset in [(e, o) for e, o in zip(again.recent, (4, 5), strict=True)]:
        entry = folded(entry, each, 0, offset) or entry
    assert (entry.state, entry.latest, entry.events) == ("succeeded", "succeeded", 2)
    assert [e.event_id for e in entry.recent if e.type == "succeeded"] == [first.event_id, again.recent[-1].event_id]
    assert [e.type for e in entry.recent] == ["started", "succeeded", "accepted", "succeeded"]
