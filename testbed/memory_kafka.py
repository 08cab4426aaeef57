"""Kafka in memory: stand-ins for the Kafka clients (daemon/kafka/clients.py's Protocols) that the
daemon's real `Service` runs on without a broker: the unit tests of its core (tests/fakes.py), and
the GPU check on a machine that has no JVM (benchmarks/gpu_daemon.py).

- `FakeProducer` keeps what was sent per topic and partition and acknowledges it at once (or holds
  the acknowledgements until `release`);
- `FakeConsumer` hands out the records it is given and keeps what was committed, paused and sought;
- `NoTable` is Kafka as the table's keeper sees it with no topics (daemon/table/keeper.py `TableKafka`): the
  keeper keeps no table, and asks nothing more.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiokafka import ConsumerRebalanceListener, TopicPartition

from daemon.kafka.clients import Batch, Consumer
from daemon.kafka.records import Record
from daemon.table.kept import Write


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

    def append(
        self, *, key: bytes | None, value: bytes, timestamp: int | None, headers: list[tuple[str, bytes]]
    ) -> object | None:
        if len(self.messages) >= self.limit:
            return None  # full: the publisher sends it and starts another
        self.messages.append((key, value, headers))
        return object()


class FakeProducer:
    def __init__(
        self, partitions: Mapping[str, int] | None = None, *, batch_limit: int = 1000, hold_acks: bool = False
    ) -> None:
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
        self.ends: dict[TopicPartition, int] = {}  # past the last record fetched: the broker's end is never before it
        self.listener: ConsumerRebalanceListener | None = None

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def subscribe(self, topics: list[str], listener: ConsumerRebalanceListener) -> None:
        self.listener = listener

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, list[FakeRecord]]:
        batches = {
            tp: batch[:max_records]
            for tp, batch in self.records.items()
            if batch and tp not in self.paused and (not partitions or tp in partitions)
        }
        for tp, batch in batches.items():
            del self.records[tp][: len(batch)]
            self.ends[tp] = max(self.ends.get(tp, 0), batch[-1].offset + 1)
        return batches

    def assignment(self) -> Collection[TopicPartition]:
        return set(self.records) | set(self.committed)

    def highwater(self, tp: TopicPartition) -> int | None:
        """As a broker's high-water mark: past every record, fetched or not (None when it has none)."""
        end = self.records[tp][-1].offset + 1 if self.records.get(tp) else self.ends.get(tp)
        return max(end, self.ends.get(tp, 0)) if end is not None else None

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


class NoTable:
    """The table's Kafka with no events topic: the keeper finds nothing to keep and waits (daemon/table/keeper.py)."""

    async def partition_counts(self) -> tuple[int, int]:
        return 0, 0

    def group(self) -> Consumer:
        raise AssertionError("no events topic: no keepers' group")

    async def state(self, partition: int) -> AsyncIterator[Sequence[Record]]:
        raise AssertionError("no state topic")
        yield []  # an async generator, as the Protocol's

    async def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    async def write(self, partition: int, writes: Sequence[Write]) -> None:
        raise AssertionError("no state topic")
