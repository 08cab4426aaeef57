"""In-memory stand-ins for the Kafka clients (daemon/kafka/clients.py's Protocols) and for the training
child (daemon/children/processes.py's), for unit tests of the daemon's core without a broker or torch:

- `FakeProducer` keeps what was sent per topic and partition and acknowledges it at once (or holds
  the acknowledgements until `release`);
- `FakeConsumer` hands out the records it is given and keeps what was committed, paused and sought;
- `FakeChildren` hands each job a `FakeChild` that follows a `Script`: the messages a real child
  would send, then how it ends (an exit status, or hanging until it is stopped).

The end-to-end tests use the real parts; these show the logic above them in milliseconds."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition

from daemon.children.child import ChildOutcome, OnMessage, follow
from daemon.children.processes import ChildSource, JobProcess
from daemon.kafka.clients import Batch, Consumer, Producer
from daemon.kafka.records import Record
from schemas.job import ChildMessage, JobSpec


@dataclass(frozen=True)
class FakeRecord:
    """What the daemon reads of a record (daemon/kafka/records.py's Record)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]] = field(default_factory=list)  # Kafka allows a null value
    timestamp: int = 0


@dataclass(frozen=True)
class Sent:
    topic: str
    partition: int
    key: bytes | None
    value: bytes
    headers: list[tuple[str, bytes]]

    def header(self, name: str) -> bytes | None:
        return dict(self.headers).get(name)


class FakeBatch:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.messages: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]] = []

    def append(self, *, key: bytes | None, value: bytes, timestamp: int | None, headers: list[tuple[str, bytes]]) -> object | None:
        if len(self.messages) >= self.limit:
            return None  # full: the publisher sends it and starts another
        self.messages.append((key, value, headers))
        return object()


class FakeProducer:
    def __init__(self, partitions: Mapping[str, int] | None = None, *, batch_limit: int = 1000, hold_acks: bool = False) -> None:
        self.partitions = dict(partitions or {})
        self.batch_limit = batch_limit
        self.hold_acks = hold_acks
        self.sent: list[Sent] = []
        self.batches = 0
        self.held: list[asyncio.Future[Any]] = []
        self.started = self.stopped = False

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.stopped = True

    async def partitions_for(self, topic: str) -> set[int]:
        return set(range(self.partitions.get(topic, 1)))

    def create_batch(self) -> FakeBatch:
        return FakeBatch(self.batch_limit)

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        assert isinstance(batch, FakeBatch), batch
        self.batches += 1
        self.sent += [Sent(topic, partition, key, value, headers) for key, value, headers in batch.messages]
        ack: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if self.hold_acks:
            self.held.append(ack)
        else:
            ack.set_result(None)
        return ack

    def release(self, error: BaseException | None = None) -> None:
        """Acknowledge (or fail, with `error`) every held batch."""
        for ack in self.held:
            ack.set_exception(error) if error is not None else ack.set_result(None)
        self.held.clear()

    def on(self, topic: str) -> list[Sent]:
        return [message for message in self.sent if message.topic == topic]


class FakeConsumer:
    def __init__(self, records: Mapping[TopicPartition, list[FakeRecord]] | None = None) -> None:
        self.records = {tp: list(batch) for tp, batch in (records or {}).items()}
        self.committed: dict[TopicPartition, int] = {}
        self.commits: list[tuple[TopicPartition, int]] = []
        self.paused: set[TopicPartition] = set()
        self.sought: dict[TopicPartition, int] = {}
        self.listener: ConsumerRebalanceListener | None = None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        self.listener = listener

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int, max_records: int) -> Mapping[TopicPartition, list[FakeRecord]]:
        batches = {tp: batch[:max_records] for tp, batch in self.records.items()
                   if batch and tp not in self.paused and (not partitions or tp in partitions)}
        for tp, batch in batches.items():
            del self.records[tp][: len(batch)]
        return batches

    def assignment(self) -> Collection[TopicPartition]:
        return set(self.records) | set(self.committed)

    def highwater(self, tp: TopicPartition) -> int | None:
        return self.records[tp][-1].offset + 1 if self.records.get(tp) else None

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.sought[tp] = offset

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        for tp, offset in offsets.items():
            self.commits.append((tp, offset))
            self.committed[tp] = offset

    async def end_offsets(self, partitions: list[TopicPartition]) -> Mapping[TopicPartition, int]:
        return {tp: self.highwater(tp) or self.committed.get(tp, 0) for tp in partitions}

    async def position(self, tp: TopicPartition) -> int:
        return self.committed.get(tp, 0)



@dataclass
class Script:
    """What a `FakeChild` does with its job: send `messages` (as a child does over its status pipe),
    then exit with `returncode`, or, with `hang`, wait until it is stopped (a stall, a timeout, a
    cancel, a daemon stop). With `artifact` it first writes the job's artifact folder, as a child's
    save stage does, for the push to upload."""

    messages: list[ChildMessage] = field(default_factory=list)
    returncode: int = 0
    hang: bool = False
    artifact: bool = True


class FakeChild:
    _pids = itertools.count(40_000)

    def __init__(self, script: Script, visible_devices: str | None, hanging: asyncio.Event | None = None) -> None:
        self.script = script
        self.visible_devices = visible_devices
        self.stop_grace_s = 10.0
        self.log_context: dict[str, str] = {}
        self._pid = next(self._pids)
        self.spec: JobSpec | None = None
        self.stopped_with: float | None = None  # the grace it was stopped with, if it was
        self.hanging = hanging if hanging is not None else asyncio.Event()  # set once it waits to be stopped

    @property
    def pid(self) -> int:
        return self._pid

    async def run(self, spec_path: Path, log_path: Path, on_start: Callable[[int], Awaitable[None]], on_message: OnMessage) -> ChildOutcome:
        outcome = ChildOutcome(returncode=0, stage="preflight")
        self.spec = JobSpec.model_validate_json(spec_path.read_text())
        await on_start(self.pid)
        if self.script.artifact:
            self.spec.artifact.mkdir(parents=True, exist_ok=True)
            (self.spec.artifact / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        for message in self.script.messages:
            await follow(message, outcome, on_message)
        if self.script.hang:
            self.hanging.set()
            try:
                await asyncio.Event().wait()  # until the task running it is cancelled
            except asyncio.CancelledError:
                self.stopped_with = self.stop_grace_s
                raise
        outcome.returncode = self.script.returncode
        return outcome


class FakeChildren:
    """Hands out a `FakeChild` per job, each following the next script (the last one repeats)."""

    def __init__(self, *scripts: Script) -> None:
        self.scripts = list(scripts)
        self.taken: list[FakeChild] = []
        self.hanging = asyncio.Event()  # set once any of its children waits to be stopped
        self.prepared: list[list[str | None]] = []
        self.closed = False

    def environment(self, visible_devices: str | None) -> dict[str, str]:
        return {} if visible_devices is None else {"CUDA_VISIBLE_DEVICES": visible_devices}

    async def prepare(self, wanted: list[str | None]) -> None:
        self.prepared.append(wanted)

    async def take(self, visible_devices: str | None) -> JobProcess:
        script = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        child = FakeChild(script, visible_devices, self.hanging)
        self.taken.append(child)
        return child

    async def close(self) -> None:
        self.closed = True


def _conforms(
    producer: FakeProducer, consumer: FakeConsumer, record: FakeRecord, child: FakeChild, children: FakeChildren,
) -> tuple[Producer, Consumer, Record, JobProcess, ChildSource]:
    """Never called: mypy (`.ci/run` checks this module) fails here when a fake stops being what the
    daemon's Protocols ask for."""
    return producer, consumer, record, child, children
