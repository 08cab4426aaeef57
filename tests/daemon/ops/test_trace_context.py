"""A request's W3C trace context comes back on its events: `traceparent` and `tracestate` from the
request's record on every event of the request, on its dead letter, and in its job's log; a
malformed one from a producer is dropped, never echoed."""

from __future__ import annotations

import json

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from daemon.kafka.options import kafka_options
from daemon.kafka.trace import trace_context
from daemon.settings import Settings
from schemas import TERMINAL_TYPES, parse_event
from testbed.client import records_of, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

PARENT = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = b"rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"


def record(headers: list[tuple[str, bytes]]) -> ConsumerRecord[bytes, bytes]:
    return ConsumerRecord("requests", 0, 0, 0, 0, b"k", b"{}", None, 1, 2, headers)


def test_only_a_well_formed_trace_context_is_carried() -> None:
    assert trace_context(record([("traceparent", PARENT), ("tracestate", STATE), ("other", b"x")])) == [
        ("traceparent", PARENT),
        ("tracestate", STATE),
    ]
    assert trace_context(record([("tracestate", STATE)])) == []  # a state without a parent means nothing
    for bad in (
        b"x" * 10_000,
        PARENT.upper(),
        b"00-" + b"0" * 32 + b"-00f067aa0ba902b7-01",
        b"ff-" + PARENT[3:],
        PARENT + b"\n",
    ):
        assert trace_context(record([("traceparent", bad), ("tracestate", STATE)])) == []
    assert trace_context(record([("traceparent", PARENT), ("tracestate", b"\xff" * 10)])) == [("traceparent", PARENT)]


@pytest.mark.slow
async def test_a_requests_trace_context_comes_back_on_its_events(
    shared_daemon: DaemonProcess, shared_settings: Settings, published: HubServer
) -> None:
    settings = shared_settings
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        traced = [("traceparent", PARENT), ("tracestate", STATE)]
        # A forged header first: it is dropped, the record is rejected for what it is, and the
        # requests behind it on the partition go on.
        await producer.send_and_wait(
            settings.requests_topic, b"[]", key=b"forged", headers=[("traceparent", b"x" * 10_000)]
        )
        await producer.send_and_wait(
            settings.requests_topic, b'{"not": "a request"}', key=b"traced-bad", headers=traced
        )
        await producer.send_and_wait(
            settings.requests_topic, json.dumps(sft_request("traced")).encode(), key=b"traced", headers=traced
        )
    finally:
        await producer.stop()
    events = await terminal_events(settings, {"traced", "traced-bad", "forged"})
    keys = [b"traced", b"traced-bad", b"forged"]
    records = await records_of(settings, settings.events_topic, keys, count=sum(len(e) for e in events.values()))
    dead_letters = await records_of(settings, settings.dlq_topic, [b"forged", b"traced-bad"])
    by_request: dict[str, list[dict[str, bytes]]] = {}
    for event_record in records:
        event = parse_event(event_record.value or b"")
        by_request.setdefault(str(event.request_id), []).append(dict(event_record.headers))
    kinds = [event.type for event in events["traced"]]
    assert kinds[0] == "accepted" and kinds[-1] == "succeeded" and "started" in kinds and "progress" in kinds
    for headers in by_request["traced"] + by_request["traced-bad"]:
        assert headers["traceparent"] == PARENT and headers["tracestate"] == STATE
    assert all("traceparent" not in headers for headers in by_request["forged"])
    assert [dict(letter.headers).get("traceparent") for letter in dead_letters] == [None, PARENT]
    assert events["forged"][-1].type in TERMINAL_TYPES
    assert f"traceparent {PARENT.decode()}" in (settings.jobs_dir / "traced" / "child.log").read_text()
