"""What every benchmark needs: a real broker, the local Hub server, the tiny model, and daemons.

Runs on the pieces the tests run on (`testbed/`: the local Hub, the daemon as a process, the
topics' client), so the benchmarks run the same real parts as the tests.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_DISABLE_XET"] = "1"  # the local Hub takes plain HTTP uploads only

import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.options import kafka_options
from daemon.local_broker import LocalKafka, free_port
from daemon.settings import Settings
from schemas.signing import new_key_pair
from testbed.data import HUB_TOKEN
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess


@dataclass
class Row:
    benchmark: str
    measure: str
    value: float | str
    unit: str = ""
    target: str = ""
    note: str = ""


def markdown(rows: list[Row], header: str) -> str:
    """The rows as a Markdown table under a header line (what `benchmarks/results/` keeps)."""
    lines = [header, "", "| benchmark | measure | value | unit | target | note |", "|---|---|---|---|---|---|"]
    lines += [f"| {r.benchmark} | {r.measure} | {r.value} | {r.unit} | {r.target} | {r.note} |" for r in rows]
    return "\n".join(lines) + "\n"


@dataclass
class Environment:
    root: Path
    broker: LocalKafka | None  # None on a broker of someone else's (`bootstrap_servers`)
    hub: HubServer
    model_dir: Path
    bootstrap_servers: str

    @classmethod
    def start(cls, bootstrap_servers: str | None = None) -> Environment:
        """A broker of its own, or with `bootstrap_servers` a running one (a test's), the Hub and the tiny model."""
        root = Path(tempfile.mkdtemp(prefix="adapterd-bench-"))
        broker = None
        if bootstrap_servers is None:
            broker = LocalKafka(data_dir=root / "kafka").start()
            bootstrap_servers = broker.bootstrap_servers
        hub = HubServer().start()
        model_dir = root / "tiny-model"
        subprocess.run(
            [sys.executable, "-m", "handlers.fixtures.tiny_model", str(model_dir)], check=True, capture_output=True
        )
        return cls(root, broker, hub, model_dir, bootstrap_servers)

    def stop(self) -> None:
        """Stop the broker and the Hub and remove the run's folder (its logs and Kafka's data, some
        hundreds of MB), unless ADAPTERD_BENCH_KEEP is set: then say where it is."""
        self.hub.stop()
        if self.broker is not None:
            self.broker.stop()
        if os.environ.get("ADAPTERD_BENCH_KEEP"):
            print(f"kept: {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def broker_cpu_seconds(self) -> float:
        """CPU seconds the broker's processes (its process group) have used."""
        assert self.broker is not None and self.broker.process is not None
        return sum(cpu_seconds(pid) for pid in group_members(self.broker.process.pid))

    async def settings(self, partitions: int = 1, **overrides: Any) -> Settings:
        """Settings with topics of their own (`partitions` each), on this environment's broker and Hub."""
        suffix = uuid.uuid4().hex[:8]
        fields: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap_servers,
            "requests_topic": f"requests-{suffix}",
            "events_topic": f"events-{suffix}",
            "dlq_topic": f"dlq-{suffix}",
            "control_topic": f"control-{suffix}",
            "group_id": f"bench-{suffix}",
            "work_dir": self.root / f"work-{suffix}",
            "hub_endpoint": self.hub.endpoint,
            "hub_token": HUB_TOKEN,
            "progress_interval_s": 10,
            "allowed_local_model_roots": [self.root],
            "log_format": "json",
            "metrics_address": f"127.0.0.1:{free_port()}",
        }
        fields.update(overrides)
        settings = Settings(**fields)
        await ensure_topics(settings, partitions=partitions)
        return settings

    def fleet_key(self) -> Path:
        """The fleet's event-signing key, made once: settings with a checkpoint store need it (it
        signs what hosts write there)."""
        path = self.root / "fleet-signing-key.pem"
        if not path.exists():
            path.write_bytes(new_key_pair()[0])
        return path

    def daemon(self, settings: Settings) -> DaemonProcess:
        return DaemonProcess(settings, settings.work_dir.with_suffix(".log")).start()


async def publish_all(settings: Settings, requests: list[dict[str, object]]) -> dict[str, tuple[int, int]]:
    """Publish requests at once, keyed by request id; where each landed: (partition, offset)."""
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        sent = [
            await producer.send(settings.requests_topic, json.dumps(r).encode(), key=str(r["request_id"]).encode())
            for r in requests
        ]
        landed = await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return {str(r["request_id"]): (meta.partition, meta.offset) for r, meta in zip(requests, landed, strict=True)}


async def wait_for_log(daemon: DaemonProcess, event: str, after: int = 0, timeout_s: float = 180) -> int:
    """Wait until the daemon's log has its `after+1`-th line with this event name; return how many it has.
    The daemon says readiness only in its log, so this polls the file."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        count = sum(1 for line in daemon.log_lines() if line.get("event") == event)
        if count > after:
            return count
        await asyncio.sleep(0.1)
    raise TimeoutError(f"no {event} in the daemon's log after {timeout_s}s")


def warm_event(settings: Settings) -> str:
    """The log event that says a daemon's next job will start warm: its fork server is ready, or
    (child_start = "spawn") a warm child is."""
    return "forkserver.ready" if settings.child_start == "fork" else "child.warm_ready"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def maps_torch(pid: int) -> bool:
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


def group_members(pgid: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members
