"""The fleet's announcer at rest on a local broker (issue 59): its CPU per second while a class's topic holds a
waiting backlog (by default 2,000 small requests and 50 of about 1 MB, four partitions, no group committed) and
nothing else happens. The first rounds read the backlog; the rounds measured after them should cost almost nothing
(each record is read and decoded once: daemon/fleet/announcer.py `Unreads`). Runnable alone:

    uv run python -m benchmarks.fleet_rest --rounds 5

prints `FLEET_REST announcer_cpu=<fraction of one core> cpu_per_round_s=... wall_per_round_s=...`. To measure
another tree (an earlier commit's `git archive`, unpacked) with this environment, put it first on the path:
`PYTHONPATH=<tree> uv run python <tree>/benchmarks/fleet_rest.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from aiokafka import AIOKafkaProducer

from daemon.fleet.announcer import ANNOUNCE_S, Announcer
from daemon.fleet.view import FleetView
from daemon.kafka.admin.group_offsets import KafkaQueueReads
from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.options import kafka_options
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.retry_state import RetrySigner
from daemon.local_broker import LocalKafka
from daemon.settings import Settings
from testbed.fleet_keys import shared_fleet_keys
from testbed.memory_kafka import FakeConsumer, FakeProducer

PARTITIONS = 4


def waiting_request(index: int, large: bool) -> bytes:
    """A valid request of the `batch` class: small, or of about 1 MB (9,900 short rows: what makes a decode slow)."""
    document: dict[str, object] = {
        "schema_version": 1,
        "request_id": f"w-{index}",
        "method": "sft",
        "model": {"id": "org/model"},
        "dataset": {"rows": [{"text": "word " * 18} for _ in range(9_900)]} if large else {"id": "org/data"},
        "training": {"max_steps": 4},
        "output": {"repo_id": f"results/w-{index}"},
        "priority_class": "batch",
        "metadata": {"team": f"t{index % 7}"},
    }
    return json.dumps(document).encode()


async def fill(settings: Settings, topic: str, small: int, large: int) -> None:
    """`small` + `large` waiting requests in `topic`, the large ones spread among the small, round the partitions."""
    every = (small + large) // max(large, 1)
    producer = AIOKafkaProducer(**kafka_options(settings), max_request_size=2 << 20, linger_ms=20)
    await producer.start()
    try:
        acks = [
            await producer.send(
                topic,
                waiting_request(index, large=index % every == 0 and index // every < large),
                key=f"w-{index}".encode(),
                partition=index % PARTITIONS,
            )
            for index in range(small + large)
        ]
        await asyncio.gather(*acks)
    finally:
        await producer.stop()


async def announcer_cpu(settings: Settings, work: Path, rounds: int) -> tuple[float, float]:
    """The announcer's CPU seconds and wall seconds a round at rest, after two rounds that read the backlog."""
    retries = RetrySigner.from_settings(settings.retry_key_file, work, settings.max_attempts)
    announcer = Announcer(
        settings,
        FleetView(settings),
        Publisher(settings, FakeProducer()),
        Partitions(FakeConsumer()),
        retries,
        KafkaQueueReads(settings),
    )
    for _ in range(2):
        await announcer.announce()
    cpu, wall = time.process_time(), time.monotonic()
    for _ in range(rounds):
        await announcer.announce()
    return (time.process_time() - cpu) / rounds, (time.monotonic() - wall) / rounds


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        broker = LocalKafka(data_dir=Path(tmp) / "kafka").start()
        try:
            settings = Settings(
                bootstrap_servers=broker.bootstrap_servers,
                work_dir=Path(tmp) / "work",
                group_id="fleet-rest",
                priority_classes=[{"name": "urgent"}, {"name": "batch", "preemptible": True}],
                default_priority_class="batch",
                **shared_fleet_keys(),
            )
            await ensure_topics(settings, partitions=PARTITIONS)
            await fill(settings, settings.class_topics["batch"], args.small, args.large)
            cpu, wall = await announcer_cpu(settings, Path(tmp), args.rounds)
            print(
                f"FLEET_REST announcer_cpu={cpu / ANNOUNCE_S:.4f} cpu_per_round_s={cpu:.3f} "
                f"wall_per_round_s={wall:.3f} rounds={args.rounds} small={args.small} large={args.large}"
            )
        finally:
            broker.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=2000)
    parser.add_argument("--large", type=int, default=50)
    asyncio.run(main(parser.parse_args()))
