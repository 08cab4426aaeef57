"""A producer's and a consumer's view of the daemon's topics, as the tests and the benchmarks use
them: publish a request (any bytes, so a hostile one too), read records back, follow requests to
their terminal events, and read the group's committed offset. Every wait has a timeout."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import ConsumerRecord

from daemon.kafka.event_reader import EventStream
from daemon.kafka.options import kafka_options
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas import TERMINAL_TYPES, Event, Progress, Started, parse_event

EVENT_TIMEOUT_S = 240.0  # a request's events, from its submission to its terminal one, on a busy 2-core machine


async def produce(
    settings: Settings,
    value: bytes,
    key: bytes | None = None,
    topic: str | None = None,
    *,
    partition: int | None = None,
    headers: list[tuple[str, bytes]] | None = None,
    timestamp_ms: int | None = None,
) -> int:
    """A plain producer's record: `partition`, `headers` and `timestamp_ms` (its own clock, any time) as it chooses."""
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(
            topic or settings.requests_topic,
            value,
            key=key,
            partition=partition,
            headers=headers,
            timestamp_ms=timestamp_ms,
        )
    finally:
        await producer.stop()
    return int(meta.offset)


async def submit(settings: Settings, request: dict[str, Any]) -> int:
    return await produce(settings, json.dumps(request).encode(), request["request_id"].encode())


async def read_records(
    settings: Settings, topic: str, count: int, timeout_s: float = EVENT_TIMEOUT_S
) -> list[ConsumerRecord[bytes, bytes]]:
    """The first `count` records of a topic (in partition order); fails if they do not arrive in time."""
    records: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(timeout_s), TopicReader(settings, topic) as reader:
        async for record in reader.records():
            records.append(record)
            if len(records) == count:
                break
    return records


async def records_of(
    settings: Settings, topic: str, keys: list[bytes], count: int | None = None, timeout_s: float = EVENT_TIMEOUT_S
) -> list[ConsumerRecord[bytes, bytes]]:
    """The first `count` records of a topic (one per key unless given) with one of these keys, in
    partition order: what a test reads back of its own from a topic other tests' records share (a
    shared daemon's DLQ and events)."""
    found: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(timeout_s), TopicReader(settings, topic) as reader:
        async for record in reader.records():
            if record.key in keys:
                found.append(record)
            if len(found) == (len(keys) if count is None else count):
                break
    return found


async def terminal_events(
    settings: Settings, request_ids: set[str | None], timeout_s: float = EVENT_TIMEOUT_S
) -> dict[str | None, list[Event]]:
    """Every event of the given requests, up to and including each one's terminal event."""
    events: dict[str | None, list[Event]] = {rid: [] for rid in request_ids}
    waiting = set(request_ids)
    async with asyncio.timeout(timeout_s), TopicReader(settings, settings.events_topic) as reader:
        async for record in reader.records():
            event = parse_event(record.value or b"")
            if event.request_id in events:
                events[event.request_id].append(event)
                if event.type in TERMINAL_TYPES:
                    waiting.discard(event.request_id)
            if not waiting:
                break
    return events


async def committed_offset(settings: Settings, partition: int = 0) -> int | None:
    consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=settings.group_id, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(settings.requests_topic, partition))
    finally:
        await consumer.stop()


async def wait_for_commit(settings: Settings, offset: int, partition: int = 0, timeout_s: float = 30) -> None:
    """Until the group's committed offset reaches `offset`. The daemon commits just after a terminal
    event is acknowledged, and Kafka offers no notification of a commit, so this polls."""
    async with asyncio.timeout(timeout_s):
        while (await committed_offset(settings, partition) or 0) < offset:
            await asyncio.sleep(0.2)
    assert await committed_offset(settings, partition) == offset


async def run_to_end(settings: Settings, request: dict[str, Any]) -> list[Event]:
    await submit(settings, request)
    return (await terminal_events(settings, {request["request_id"]}))[request["request_id"]]


async def submit_and_follow(
    settings: Settings,
    request: dict[str, Any],
    until: Callable[[list[Event]], bool] | None = None,
    timeout_s: float = EVENT_TIMEOUT_S,
) -> list[Event]:
    """Submit a request and return its events up to its terminal one, or up to the first after which `until` (shown
    the events so far, the newest last, as each comes: it may act on them, kill the child a `started` names, say)
    says the test has what it waits for. Read from the end of the events topic as it was before the submission: an
    earlier request with the same id is not seen."""
    events: list[Event] = []
    async with asyncio.timeout(timeout_s), EventStream(settings, from_end=True) as stream:
        await submit(settings, request)
        async for event in stream.events(request["request_id"]):
            events.append(event)
            if until is not None and until(events):
                break
    return events


def past_step(step: int) -> Callable[[list[Event]], bool]:
    """For `submit_and_follow`'s `until`: the job has reported training step `step` or a later one."""
    return lambda events: isinstance(events[-1], Progress) and events[-1].step >= step


def child_pid(events: list[Event]) -> int:
    """The pid of the child the latest `started` of these events names."""
    return [event for event in events if isinstance(event, Started)][-1].pid
