"""The daemon's core wired as `Service` wires it (`daemon.service.wire`, the one wiring), on the
in-memory fakes of tests/fakes.py: the publisher, partitions, slots, scheduler and intake, and with
priority classes the fleet's dispatcher (over `FakeFleetKafka`), with nothing of Kafka, the child or
torch underneath."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable

from aiokafka import TopicPartition

from daemon.admission.gpu_kinds import HostGpus, kind_memory
from daemon.children.processes import ChildSource
from daemon.fleet.dispatcher import Dispatcher
from daemon.resources.slots import Slots, packing_from
from daemon.service import wire
from daemon.settings import Settings
from schemas import RequestBase, decode_request
from testbed.memory_kafka import NoTable
from tests.fakes import FakeChildren, FakeConsumer, FakeFleetKafka, FakeProducer, FakeRecord, Script, Sent


class CoreOnFakes:
    """`daemon.service.Core` as `wire` builds it, with the fakes it runs on and helpers to feed and read them."""

    def __init__(
        self,
        settings: Settings,
        producer: FakeProducer | None = None,
        children: ChildSource | None = None,
        fleet: FakeFleetKafka | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.producer = producer if producer is not None else FakeProducer()
        self.consumer = FakeConsumer()
        # A scripted child by default; any ChildSource will do (tests/daemon/core/test_child_seam.py's runs elsewhere).
        self.children = children if children is not None else FakeChildren(Script())
        self.fleet = fleet if fleet is not None else FakeFleetKafka()  # the fleet's Kafka, with priority classes
        gpus = settings.gpus or []
        # As Service builds them, GPUs declared, and their kind too (nvidia-smi is never asked here).
        named = settings.gpu_kind
        kind = HostGpus(named, kind_memory(named, settings.gpu_kinds), True) if gpus and named else None
        slots = Slots(
            gpus, settings.job_slots, packing_from(settings), kind, settings.ray.max_jobs if settings.ray else 0
        )
        core = wire(
            settings,
            self.consumer,
            self.producer,
            slots,
            self.children,
            on_change=lambda: None,
            fleet=self.fleet.kafka(),
            clock=clock,
            table=NoTable(),  # the table's keeper is wired, never run: the core decides without it
        )
        self.publisher, self.partitions, self.slots, self.scheduler, self.intake, self.dispatcher = (
            core.publisher,
            core.partitions,
            core.slots,
            core.scheduler,
            core.intake,
            core.dispatcher,
        )
        self.tp = TopicPartition(settings.requests_topic, 0)
        self.consumer.committed[self.tp] = 0  # assigned to this member

    def fleet_host(self, claims_partitions: int, records: Iterable[FakeRecord] = ()) -> Dispatcher:
        """This core as a host of a fleet with priority classes: its loop holds `claims_partitions` of the claims
        topic (not the requests topic), and the classes' topics hold `records` (offsets from 0 in each partition).
        Its dispatcher, as `wire` built it."""
        del self.consumer.committed[self.tp]
        for partition in range(claims_partitions):
            self.consumer.committed[TopicPartition(self.settings.claims_topic, partition)] = 0
        for record in records:
            self.fleet.log(TopicPartition(record.topic, record.partition)).append(record)
        assert self.dispatcher is not None, "no priority classes: no fleet"
        return self.dispatcher

    def record(
        self, document: dict[str, object], offset: int = 0, headers: list[tuple[str, bytes]] | None = None
    ) -> FakeRecord:
        return FakeRecord(
            self.tp.topic,
            self.tp.partition,
            offset,
            str(document["request_id"]).encode(),
            json.dumps(document).encode(),
            headers or [],
        )

    @staticmethod
    def request(record: FakeRecord) -> RequestBase:
        decoded = decode_request(record.value)
        assert isinstance(decoded, RequestBase), decoded
        return decoded

    def events(self, request_id: str | None = None) -> list[dict[str, object]]:
        found = [json.loads(m.value) for m in self.producer.on(self.settings.events_topic)]
        return [event for event in found if request_id is None or event["request_id"] == request_id]

    def types(self, request_id: str | None = None) -> list[str]:
        return [str(event["type"]) for event in self.events(request_id)]

    def dead_letters(self) -> list[Sent]:
        return self.producer.on(self.settings.dlq_topic)

    def requeued(self) -> list[Sent]:
        return self.producer.on(self.settings.requests_topic)


THREADS_WAIT_S = 30.0  # the most a core's worker threads are given, on a loaded machine, to get a task further


async def turns_until(condition: Callable[[], bool]) -> None:
    """Give the loop turns until the core's tasks have got as far as `condition`: first turns alone (no timed sleep:
    what runs on the loop gets there in them), then, where a task waits for a worker thread (a job's folder written, a
    seal verified in the `verify` threads), turns a millisecond apart for up to THREADS_WAIT_S. Turns alone failed
    on CI's loaded 2 cores: ten thousand of them passed before a thread had its turn of the interpreter."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + THREADS_WAIT_S
    while loop.time() < deadline:
        if condition():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never got there")
