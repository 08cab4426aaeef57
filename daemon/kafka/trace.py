"""W3C trace context (`traceparent`, `tracestate`) from a request's Kafka record, carried onto
every event of that request, its dead letter and its retries, and into its job's child, so a
pipeline that traces its work (OpenTelemetry's Kafka instrumentation writes these headers) sees
adapterd's part inside its own trace.

A producer's headers are untrusted: a `traceparent` is carried only when it has W3C's form
(version 00, a non-zero trace and parent id) and a `tracestate` only beside one, at most 512
bytes of printable ASCII. Anything else is dropped, never echoed.
"""

from __future__ import annotations

import re

from daemon.kafka.records import Record

Headers = list[tuple[str, bytes]]

_TRACEPARENT = re.compile(rb"00-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}")
_TRACESTATE = re.compile(rb"[\x20-\x7e]{1,512}")


def trace_context(record: Record) -> Headers:
    """The record's trace headers that are well-formed, in W3C's order; [] when it has none."""
    headers = dict(record.headers or ())
    parent = headers.get("traceparent")
    if parent is None or not _TRACEPARENT.fullmatch(parent):
        return []
    state = headers.get("tracestate")
    return [("traceparent", parent)] + (
        [("tracestate", state)] if state is not None and _TRACESTATE.fullmatch(state) else []
    )


def traceparent(trace: Headers) -> str | None:
    """The `traceparent` value of carried trace headers, for the child and the logs."""
    return next((value.decode() for name, value in trace if name == "traceparent"), None)
