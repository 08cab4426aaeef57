"""Intake throughput: rejected requests per second end to end, against a bare aiokafka consumer.

The target is the rate no worse than the head before a change, side by side (`benchmarks.compare
REV`), not a fixed rate: a rate is the host's. The daemon's rejection path is bound by one event
loop's CPU, and its in-process part alone (benchmarks.reject_path: decode, validation, secret scan,
the event and the DLQ record, batching; no broker) cost 35-38 µs a message at 67ce75e on 2 quiet
cores (docs/development.md), a ceiling of about 27,000/s before aiokafka reads the message and
produces two records for it: the 50,000/s once printed here was out of reach by construction (issue
52). Nor is a share of the bare consumer a target: it reads 20,000 records in a few fetches, and its
rate moved from 80,000 to 405,000/s between runs of one side-by-side comparison on a shared 2-core
host, while the daemon's moved from 3,300 to 5,100/s; the ratio is printed, for what it shows.
"""

from __future__ import annotations

import json
import time

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from benchmarks.harness import Environment, Row
from daemon.settings import Settings
from testbed.client import read_records, wait_for_commit


def bad_message(index: int) -> bytes:
    if index % 2:
        return b"{not json " + str(index).encode()
    return json.dumps(
        {
            "schema_version": 1,
            "request_id": f"bad-{index}",
            "method": "sft",
            "model": {"id": "x/y"},
            "dataset": {"rows": [{"text": "t"}]},
            "output": {"repo_id": "a/b"},
            "training": {"learning_rat": 1},
        }
    ).encode()


async def fill(settings: Settings, count: int) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.bootstrap_servers, acks="all", linger_ms=20, max_batch_size=1 << 20
    )
    await producer.start()
    try:
        acks = [
            await producer.send(settings.requests_topic, bad_message(i), key=f"bad-{i}".encode()) for i in range(count)
        ]
        for ack in acks:
            await ack
    finally:
        await producer.stop()


async def bare_consumer_rate(settings: Settings, count: int) -> float:
    consumer = AIOKafkaConsumer(
        settings.requests_topic,
        bootstrap_servers=settings.bootstrap_servers,
        group_id=None,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    seen, first = 0, 0.0
    try:
        while seen < count:
            batch = await consumer.getmany(timeout_ms=1000, max_records=2000)
            for records in batch.values():
                if seen == 0 and records:
                    first = time.monotonic()
                seen += len(records)
    finally:
        await consumer.stop()
    return (count - 1) / (time.monotonic() - first)


async def run(env: Environment, count: int) -> list[Row]:
    settings = await env.settings(warm_child=False, log_level="error")
    await fill(settings, count)
    bare = bare_consumer_rate_result = await bare_consumer_rate(settings, count)

    daemon = env.daemon(settings)
    try:
        events = await read_records(settings, settings.events_topic, count, timeout_s=600)
        # The daemon commits just after an event is acknowledged: wait for the commit, not for luck.
        await wait_for_commit(settings, count)
    finally:
        daemon.stop()
    # The daemon's own pace: broker timestamps of its first and last `rejected` event.
    span_s = (events[-1].timestamp - events[0].timestamp) / 1000
    rate = (count - 1) / span_s
    return [
        Row("intake", "bare aiokafka consumer", round(bare_consumer_rate_result), "msg/s", note=f"{count} messages"),
        Row(
            "intake",
            "daemon: rejected (validate, DLQ, event, commit)",
            round(rate),
            "msg/s",
            "no worse than before",
            note="log_level=error; judged side by side (benchmarks.compare REV); where it is bound: "
            "benchmarks.intake_profile, benchmarks.reject_path",
        ),
        Row(
            "intake",
            "ratio daemon/bare consumer",
            round(rate / bare, 3),
            "",
            note="not a target: the bare rate is a few fetches' (module docstring)",
        ),
    ]
