"""What the GPU check (benchmarks/gpu_check.py) runs its rows through: adapterd's real `Service` on
Kafka in memory (testbed/memory_kafka.py), so that it needs no JVM and no broker, and plain TRL
(benchmarks/plain_sft.py) in the same process tree.

The daemon's scheduler, slots (packing included: `max_jobs_per_gpu`), supervisor, fork server,
children, publisher and local sink are the real ones; only the Kafka clients are in memory, with one
partition per job meant to run at once (the scheduler runs one job a partition). The control topic
needs a broker, so cancels are not checked here.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu_jobs import gpu_used_mib

TERMINAL = ("succeeded", "failed", "rejected", "cancelled")


class PeakMemory:
    """The GPU's used memory sampled every 0.2 s while jobs run (nothing without CUDA)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.peak, self._stop = cuda, 0.0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        if self.cuda:
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, gpu_used_mib())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.cuda:
            self._thread.join()


def plain(root: Path, request: dict[str, Any], copies: int = 1) -> list[dict[str, Any]]:
    """The same SFT job as plain TRL scripts (benchmarks.plain_sft), `copies` of them at once."""
    path = root / f"plain-{request['request_id']}.json"
    path.write_text(json.dumps(request))
    started = time.monotonic()
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.plain_sft", str(path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(copies)
    ]
    results = []
    for run in runs:
        out, err = run.communicate()
        if run.returncode != 0:
            raise RuntimeError("plain TRL failed: " + err[-2000:])
        results.append({"wall": time.monotonic() - started, **json.loads(out.strip().splitlines()[-1])})
    return results


class NoControl:
    """The control topic's reader, which needs a broker: cancels are not checked here."""

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass


class Daemon:
    """adapterd's `Service` on Kafka in memory, its settings the host's defaults but for `overrides`."""

    def __init__(
        self, work_dir: Path, model_roots: list[Path], cuda: bool, partitions: int = 1, **overrides: Any
    ) -> None:
        from aiokafka import TopicPartition

        from daemon.service import Service
        from daemon.settings import Settings
        from testbed.memory_kafka import FakeConsumer, FakeProducer, NoTable

        self.settings = Settings(
            work_dir=work_dir,
            allowed_local_model_roots=model_roots,
            metrics_address=None,
            log_format="json",
            progress_interval_s=5,
            stall_timeout_s=600,
            hub_token=None,
            **overrides,
        )

        class PolledConsumer(FakeConsumer):
            def __init__(self) -> None:
                super().__init__()
                self.log: dict[
                    TopicPartition, list[Any]
                ] = {}  # every record submitted, by partition: what a seek reads again

            async def getmany(self, *partitions: TopicPartition, timeout_ms: int, max_records: int) -> Any:
                batches = await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)
                if (
                    not batches
                ):  # a real poll waits when nothing is there; one that returns at once never yields the loop
                    await asyncio.sleep(min(timeout_ms, 200) / 1000)
                return batches

            def seek(self, tp: TopicPartition, offset: int) -> None:
                # As a broker's consumer: read on from `offset`, records already fetched included. The
                # scheduler holds a partition at a record (an estimate worked out, a slot not free) and
                # reads it again when it resumes.
                super().seek(tp, offset)
                self.records[tp] = [record for record in self.log.get(tp, []) if record.offset >= offset]

        self.consumer, self.producer = PolledConsumer(), FakeProducer()
        self.service = Service(self.settings, consumer=self.consumer, producer=self.producer, table=NoTable())
        self.service.control = NoControl()  # type: ignore[assignment]
        self.partitions = [TopicPartition(self.settings.requests_topic, index) for index in range(partitions)]
        for tp in self.partitions:
            self.consumer.committed[tp] = 0
            self.consumer.records[tp] = []
        self.offsets = dict.fromkeys(self.partitions, 0)
        self.cuda = cuda
        self.task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """The service running and its fork server ready (or said why not, in children.log)."""
        self.task = asyncio.create_task(self.service.run())
        for _ in range(1200):
            if self.forkserver_pid() is not None:
                return
            await asyncio.sleep(0.25)

    def children_log(self) -> str:
        path = self.settings.work_dir / "children.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def forkserver_pid(self) -> int | None:
        """This daemon's fork server, by the ready line it wrote to the daemon's children.log, if alive."""
        ready = re.findall(r"adapterd fork server (\d+): ready", self.children_log())
        return int(ready[-1]) if ready and Path(f"/proc/{ready[-1]}").exists() else None

    def events(self, request_id: str) -> list[dict[str, Any]]:
        found = [json.loads(m.value) for m in self.producer.on(self.settings.events_topic)]
        return [e for e in found if e.get("request_id") == request_id]

    def submit(self, request: dict[str, Any], partition: int = 0) -> None:
        from testbed.memory_kafka import FakeRecord

        tp = self.partitions[partition]
        rid = request["request_id"]
        record = FakeRecord(
            tp.topic,
            tp.partition,
            self.offsets[tp],
            rid.encode(),
            json.dumps(request).encode(),
            [],
            int(time.time() * 1000),
        )
        self.consumer.records[tp].append(record)
        self.consumer.log.setdefault(tp, []).append(record)
        self.offsets[tp] += 1

    async def job(self, request: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One job: its last event, wall time, GPU memory before / peak / after, and whether its child
        was forked from the fork server (seen from outside, in /proc) and mapped bitsandbytes' library."""
        [result] = (await self.at_once([request], timeout_s))["jobs"]
        return result

    async def at_once(self, requests: list[dict[str, Any]], timeout_s: float) -> dict[str, Any]:
        """`requests` submitted together, one a partition; each one's result (as `job` says), the wall
        time to the last, and the most jobs the daemon's slots held on one GPU at once."""
        before = gpu_used_mib() if self.cuda else 0.0
        started = time.monotonic()
        for partition, request in enumerate(requests):
            self.submit(request, partition)
        assert self.task is not None
        ids = [request["request_id"] for request in requests]
        parents: dict[str, int] = {}
        native: dict[str, set[str]] = {rid: set() for rid in ids}
        most_on_a_gpu = 0
        with PeakMemory(self.cuda) as memory:
            while time.monotonic() - started < timeout_s and not all(
                any(e["type"] in TERMINAL for e in self.events(rid)) for rid in ids
            ):
                if self.task.done():
                    raise RuntimeError(f"the service ended: {self.task.exception()!r}")
                most_on_a_gpu = max([most_on_a_gpu, *(jobs for jobs, _ in self.service.slots.by_gpu().values())])
                for rid in ids:
                    pid = next((e["pid"] for e in self.events(rid) if e["type"] == "started"), None)
                    if pid is None:
                        continue
                    try:
                        parents.setdefault(rid, int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
                        maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
                        native[rid] |= {line.rsplit("/", 1)[-1] for line in maps if "libbitsandbytes_" in line}
                    except (OSError, IndexError, ValueError):
                        pass  # it ended
                await asyncio.sleep(0.2)
        wall = time.monotonic() - started
        await asyncio.sleep(1.0)  # the children's exit, their memory handed back
        after = gpu_used_mib() if self.cuda else 0.0
        server = self.forkserver_pid()
        jobs = []
        for rid in ids:
            events = self.events(rid)
            jobs.append(
                {
                    "final": events[-1] if events else {"type": "timeout"},
                    "wall": wall,
                    "before": before,
                    "peak": memory.peak,
                    "after": after,
                    "forked": parents.get(rid) is not None and parents.get(rid) == server,
                    "native": sorted(native[rid]),
                }
            )
        return {"jobs": jobs, "wall": wall, "most_on_a_gpu": most_on_a_gpu, "peak": memory.peak}

    async def stop(self) -> None:
        self.service.request_stop()
        if self.task is not None:
            await asyncio.wait_for(self.task, 120)
