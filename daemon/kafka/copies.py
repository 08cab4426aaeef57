"""The daemon's own copies of a request fit the brokers' largest record (issue 37).

A request travels again as a retry (its bytes, with the signed retry headers, its producer's
signature and its trace context) and as a DLQ record (its bytes, with why and where from). Both add headers to a record
that already reached the requests topic, so a request close to the brokers' limit would make
copies the broker refuses: the request read and trained again on every read, or its DLQ copy lost.

So the limit is decided at intake: a request is accepted only when it is at most
`max_message_bytes - COPY_HEADROOM_BYTES` (key and value), COPY_HEADROOM_BYTES bounding what the
daemon adds (the retry and trace headers, the DLQ headers with their error list cut to
ERRORS_HEADER_BYTES, the record's framing). A record refused for its size, or any other whose DLQ
copy would not fit, goes to the DLQ without its value, saying so (`adapterd-value-omitted` and its
size): the bytes stay at the source offset the DLQ record names, never silently lost.
"""

from __future__ import annotations

from pydantic import TypeAdapter

from daemon.kafka.records import Record
from schemas import FieldError
from schemas.signing import PRODUCER_SIGNATURE_HEADER

# retry headers ~150 B, trace context at most ~600 B, a producer's signature at most 256 B,
# DLQ headers <= 5 KiB, framing
COPY_HEADROOM_BYTES = 8192
ERRORS_HEADER_BYTES = 4096  # the DLQ's `adapterd-errors`; the `rejected` event carries them all
FIELD_ERRORS = TypeAdapter(list[FieldError])


def request_bytes(record: Record) -> int:
    """What a copy carries of the record itself: its key and value."""
    return len(record.key or b"") + len(record.value or b"")


def too_large(record: Record, max_message_bytes: int) -> FieldError | None:
    """Why the record's copies would not fit, or None: the limit named."""
    most = max_message_bytes - COPY_HEADROOM_BYTES
    size = request_bytes(record)
    if size <= most:
        return None
    return FieldError(
        path="",
        message=(
            f"the record is {size} bytes (key and value); a request is at most {most} bytes, so that the daemon's "
            f"retry and DLQ copies, which add up to {COPY_HEADROOM_BYTES} bytes of headers, fit the brokers' "
            f"{max_message_bytes} (max_message_bytes)"
        ),
    )


def dlq_value(record: Record, max_message_bytes: int) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The value a DLQ copy carries, and the headers that say it was left out: the record's own
    bytes when the copy fits, else none."""
    if request_bytes(record) <= max_message_bytes - COPY_HEADROOM_BYTES:
        return record.value or b"", []
    return b"", [("adapterd-value-omitted", str(len(record.value or b"")).encode())]


def errors_header(errors: list[FieldError]) -> bytes:
    """The DLQ's `adapterd-errors` header, cut to ERRORS_HEADER_BYTES: as many errors as fit, then
    how many more the `rejected` event holds."""
    dumped = FIELD_ERRORS.dump_json(errors)
    if len(dumped) <= ERRORS_HEADER_BYTES:
        return dumped
    kept = list(errors)
    while kept:
        kept.pop()
        more = FieldError(
            path="", message=f"and {len(errors) - len(kept)} more errors (the rejected event has them all)"
        )
        dumped = FIELD_ERRORS.dump_json([*kept, more])
        if len(dumped) <= ERRORS_HEADER_BYTES:
            return dumped
    return FIELD_ERRORS.dump_json(
        [FieldError(path="", message=f"{len(errors)} errors (the rejected event has them all)")]
    )


# A producer's signature is some 110 bytes (`ed25519:<16 hex>:<88 base64>`): a larger header
# is not one, and is not carried.
MAX_SIGNATURE_BYTES = 256


def producer_signature(record: Record) -> tuple[tuple[str, bytes], ...]:
    """The producer's signature header (daemon/admission/grants.py), carried by every copy of the request (a retry, a
    claim, a move, a requeue) so that the copy is judged by who wrote it as the original was: kept only when there is
    exactly one, of a signature's size (else none, which a host with bound teams refuses, as it would the original)."""
    found = [value for name, value in record.headers or () if name == PRODUCER_SIGNATURE_HEADER]
    if len(found) == 1 and found[0] is not None and len(found[0]) <= MAX_SIGNATURE_BYTES:
        return ((PRODUCER_SIGNATURE_HEADER, found[0]),)
    return ()
