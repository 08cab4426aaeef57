"""In-memory stand-ins for the Kafka clients (daemon/kafka/clients.py's Protocols) and for the training
child (daemon/children/processes.py's), for unit tests of the daemon's core without a broker or torch:

- `FakeProducer` and `FakeConsumer`, Kafka in memory (testbed/memory_kafka.py, shared with the GPU check);
- `FakeFleetKafka`, what the fleet's queue asks of Kafka (daemon/kafka/clients.py `FleetKafka`): the classes'
  and the claims topics as logs, the queue groups' consumers and committed offsets, and transactions that
  write their copies and commit their offset together (or, refused, neither);
- `FakeChildren` hands each job a `FakeChild` that follows a `Script`: the messages a real child
  would send, then how it ends (an exit status, or hanging until it is stopped).

The end-to-end tests use the real parts; these show the logic above them in milliseconds."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka import ConsumerRebalanceListener, TopicPartition

from daemon.children.child import ChildExit, ChildJob, ChildPlace
from daemon.children.processes import ChildHandle, ChildSource
from daemon.kafka.clients import Consumer, FleetKafka, Producer, QueueConsumer, QueueReads, Transactions, Write
from daemon.kafka.records import Record
from handlers.protocol import ChildMessage, JobSpec
from testbed.memory_kafka import FakeBatch, FakeConsumer, FakeProducer, FakeRecord, Sent

__all__ = [
    "FakeBatch",
    "FakeChild",
    "FakeChildren",
    "FakeConsumer",
    "FakeFleetKafka",
    "FakeProducer",
    "FakeQueueConsumer",
    "FakeRecord",
    "Script",
    "Sent",
]


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

    def __init__(
        self,
        script: Script,
        job: ChildJob,
        hanging: asyncio.Event | None = None,
        by_request: dict[str, list[Script]] | None = None,
    ) -> None:
        self.visible_devices = job.visible_devices
        self.spec: JobSpec = job.spec  # the job as its source was handed it
        turns = (by_request or {}).get(job.request_id)
        if turns:  # this request's next script (its last repeats), whichever child it took
            script = turns.pop(0) if len(turns) > 1 else turns[0]
        self.script = script
        self.where = ChildPlace.local(
            next(self._pids)
        )  # a child elsewhere is named otherwise (tests/daemon/core/test_child_seam.py)
        self.stops: list[float] = []  # the grace of each `stop` it was given
        self.cancelled_unstopped = False  # a read of its messages was cancelled without a `stop` first
        self.hanging = hanging if hanging is not None else asyncio.Event()  # set once it waits to be stopped
        self._stopped = asyncio.Event()

    @property
    def place(self) -> ChildPlace:
        return self.where

    @property
    def stopped_with(self) -> float | None:
        """The grace of its one stop, None if it was not stopped (and a test fails on a second)."""
        assert len(self.stops) <= 1, f"stopped {len(self.stops)} times: {self.stops}"
        return self.stops[0] if self.stops else None

    async def stop(self, grace_s: float) -> None:
        self.stops.append(grace_s)
        self._stopped.set()

    def messages(self) -> AsyncIterator[ChildMessage]:
        return self._follow_script()

    async def _follow_script(self) -> AsyncIterator[ChildMessage]:
        if self.script.artifact:
            self.spec.artifact.mkdir(parents=True, exist_ok=True)
            (self.spec.artifact / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        for message in self.script.messages:
            yield message
        if self.script.hang:
            self.hanging.set()
            try:
                await self._stopped.wait()  # until it is stopped, as a training child runs until SIGTERM
            except asyncio.CancelledError:
                self.cancelled_unstopped = not self.stops
                raise

    async def wait(self) -> ChildExit:
        if self.script.hang:
            return ChildExit(-15 if self.stops[0] > 0 else -9)  # SIGTERM, or SIGKILL at once
        return ChildExit(self.script.returncode)


class FakeChildren:
    """Hands out a `FakeChild` per job, each following the next script (the last one repeats), or the
    scripts `by_request` names for its job's request, in turn. Jobs started together take their children in
    an order nobody fixes (each awaits a thread first), so a test that gives two of them different
    scripts names them by request."""

    def __init__(self, *scripts: Script, by_request: dict[str, list[Script]] | None = None) -> None:
        self.scripts = list(scripts)
        self.by_request = by_request or {}
        self.taken: list[FakeChild] = []
        self.hanging = asyncio.Event()  # set once any of its children waits to be stopped
        self.prepared: list[list[str | None]] = []
        self.launched: list[tuple[str | None, int]] = []  # (visible devices, GPUs) of each data-parallel launch
        self.closed = False

    async def prepare(self, wanted: list[str | None]) -> None:
        self.prepared.append(wanted)

    async def start(self, job: ChildJob) -> ChildHandle:
        """The job's child, following the next script; a job of several GPUs (its launcher) noted in `launched`."""
        if job.gpus > 1:
            self.launched.append((job.visible_devices, job.gpus))
        script = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        child = FakeChild(script, job, self.hanging, self.by_request)
        self.taken.append(child)
        return child

    async def close(self) -> None:
        self.closed = True


@dataclass(frozen=True)
class Moved:
    """One transaction of `FakeFleetKafka`: what it wrote, and the offset it committed for `group`."""

    writes: list[FakeRecord]
    group: str
    tp: TopicPartition
    offset: int


class FakeFleetKafka:
    """The fleet's Kafka in memory: each topic partition a log (`logs`, offsets from 0), each queue group's committed
    offsets (`offsets`), its consumers (`consumers`, by group), and the transactions made (`moves`). A transaction
    writes its copies and commits its offset, or raises `refuse` and does neither, as a broker's abort."""

    def __init__(self, partitions: Mapping[str, int] | None = None) -> None:
        self.partitions = dict(partitions or {})  # topic → its partitions (1 when unnamed)
        self.logs: dict[TopicPartition, list[FakeRecord]] = {}
        self.offsets: dict[tuple[str, TopicPartition], int] = {}  # (group, partition) → its committed offset
        self.consumers: dict[str, FakeQueueConsumer] = {}
        self.moves: list[Moved] = []
        self.refuse: BaseException | None = None
        self.started = False

    def kafka(self) -> FleetKafka:
        return FleetKafka(self, self.queue_consumer, self)

    def log(self, tp: TopicPartition) -> list[FakeRecord]:
        return self.logs.setdefault(tp, [])

    def on(self, topic: str) -> list[FakeRecord]:
        """What the topic holds, partition by partition."""
        return [record for tp in sorted(self.logs) if tp.topic == topic for record in self.logs[tp]]

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes,
        headers: Iterable[tuple[str, bytes]] = (),
        *,
        partition: int = 0,
        timestamp: int | None = None,
    ) -> FakeRecord:
        """A record written outside a transaction: a producer's request."""
        log = self.log(TopicPartition(topic, partition))
        stamp = int(time.time() * 1000) if timestamp is None else timestamp
        log.append(FakeRecord(topic, partition, len(log), key, value, list(headers), timestamp=stamp))
        return log[-1]

    # Transactions
    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None:
        self.started = False

    async def commit_with(self, writes: Sequence[Write], group: str, tp: TopicPartition, offset: int) -> int | None:
        if self.refuse is not None:
            raise self.refuse
        written = [
            self.produce(
                w.topic,
                w.key,
                w.value,
                w.headers,
                partition=w.partition if w.partition is not None else 0,
                timestamp=w.timestamp_ms,
            )
            for w in writes
        ]
        self.offsets[(group, tp)] = offset
        self.moves.append(Moved(written, group, tp, offset))
        return written[-1].offset if written else None

    # The queue consumers
    def queue_consumer(self, group: str) -> FakeQueueConsumer:
        return self.consumers.setdefault(group, FakeQueueConsumer(self, group))

    # QueueReads
    async def committed(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict[int, int]]:
        return {
            (group, topic): {
                tp.partition: at for (g, tp), at in self.offsets.items() if g == group and tp.topic == topic
            }
            for group, topic in wanted
        }

    async def waiting(self, topic: str, start_at: Mapping[int, int], most: int) -> list[FakeRecord]:
        found = [r for r in self.on(topic) if r.offset >= start_at.get(r.partition, 0)]
        return found[:most]

    async def close(self) -> None:
        pass


class FakeQueueConsumer:
    """A class topic's consumer in its queue group, alone in it: the next poll after `subscribe` is assigned every
    partition of the topic (aiokafka's rebalance happens within a poll), from the group's committed offsets."""

    def __init__(self, fleet: FakeFleetKafka, group: str) -> None:
        self.fleet, self.group = fleet, group
        self.topic: str | None = None
        self.listener: ConsumerRebalanceListener | None = None
        self.assigned: set[TopicPartition] = set()
        self.positions: dict[TopicPartition, int] = {}
        self.paused: set[TopicPartition] = set()
        self.joins = self.leaves = 0

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        [self.topic] = topics
        self.listener = listener
        self.joins += 1

    def unsubscribe(self) -> None:
        self.topic, self.listener, self.assigned = None, None, set()
        self.leaves += 1

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[FakeRecord]]:
        if self.listener is not None and self.topic is not None and not self.assigned:
            self.assigned = {TopicPartition(self.topic, n) for n in range(self.fleet.partitions.get(self.topic, 1))}
            for tp in self.assigned:
                self.positions[tp] = self.fleet.offsets.get((self.group, tp), 0)
            self.paused.clear()
            await self.listener.on_partitions_assigned(set(self.assigned))
        batches = {}
        for tp in sorted(self.assigned):
            if tp in self.paused or (partitions and tp not in partitions):
                continue
            batch = [r for r in self.fleet.log(tp) if r.offset >= self.positions[tp]][:max_records]
            if batch:
                batches[tp] = batch
                self.positions[tp] = batch[-1].offset + 1
        return batches

    def assignment(self) -> Collection[TopicPartition]:
        return set(self.assigned)

    def highwater(self, tp: TopicPartition) -> int | None:
        return len(self.fleet.log(tp))

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.positions[tp] = offset

    def pause(self, *partitions: TopicPartition) -> None:
        self.paused.update(partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        self.paused.difference_update(partitions)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        raise AssertionError("a queue's offsets are committed by moves only")

    async def end_offsets(self, partitions: list[TopicPartition]) -> Mapping[TopicPartition, int]:
        return {tp: len(self.fleet.log(tp)) for tp in partitions}

    async def position(self, tp: TopicPartition) -> int:
        return self.positions.get(tp, 0)


def _conforms(
    producer: FakeProducer,
    consumer: FakeConsumer,
    record: FakeRecord,
    child: FakeChild,
    children: FakeChildren,
    fleet: FakeFleetKafka,
) -> tuple[Producer, Consumer, Record, ChildHandle, ChildSource, Transactions, QueueConsumer, QueueReads]:
    """Never called: mypy (`.ci/run` checks this module) fails here when a fake stops being what the
    daemon's Protocols ask for."""
    return producer, consumer, record, child, children, fleet, fleet.queue_consumer(""), fleet
