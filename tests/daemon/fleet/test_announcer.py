"""The announcer's `queued` events for requests no host has read (daemon/fleet/announcer.py), on the real broker:
a request a host claims while the queues are being read is not told it waits (its consumers would see it wait
after its `started`); one whose cancel the host has read is neither told nor counted (on the fakes)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from daemon.errors import TopicMissing
from daemon.fleet.announcer import Announcer, Unread
from daemon.fleet.policy.order import waiting_for
from daemon.fleet.view import FleetView
from daemon.job.events import JobEvents
from daemon.kafka.admin.group_offsets import KafkaQueueReads
from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.options import kafka_options
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.retry_state import RetrySigner
from daemon.settings import Settings
from daemon.settings.fleet import queue_group
from schemas import Accepted, Progress, Queued, RequestBase, decode_request, parse_event
from testbed.client import produce
from testbed.fleet_keys import shared_fleet_keys
from testbed.memory_kafka import FakeConsumer, FakeProducer
from tests.daemon.fleet.test_fleet_usage import read
from tests.fakes import FakeFleetKafka
from tests.helpers import sft_request

CLASSES = [{"name": "urgent"}, {"name": "batch", "preemptible": True}]


async def commit(settings: Settings, group: str, tp: TopicPartition, offset: int) -> None:
    """What a host's claim does to the queue it took the record from: its group's offset committed past it."""
    consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        consumer.assign([tp])
        await consumer.commit({tp: offset})
    finally:
        await consumer.stop()


async def test_a_request_claimed_while_the_queues_were_read_is_not_told_it_waits(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = settings.model_copy(
        update={
            **shared_fleet_keys(),
            "priority_classes": Settings(priority_classes=CLASSES, **shared_fleet_keys()).priority_classes,
            "default_priority_class": "batch",
            "claims_topic": f"claims-{settings.group_id}",
        }
    )
    await ensure_topics(fleet, partitions=1)
    topic = fleet.class_topics["batch"]
    offsets = {
        name: await produce(
            fleet, json.dumps(sft_request(name, priority_class="batch")).encode(), name.encode(), topic=topic
        )
        for name in ("claimed-meanwhile", "still-waiting")
    }
    producer = FakeProducer()

    class ClaimedWhileRead(Announcer):
        async def unread(self) -> list[Unread]:
            found = await super().unread()
            assert sorted(each.waiting.request_id for each in found) == ["claimed-meanwhile", "still-waiting"]
            await commit(
                fleet, queue_group(fleet.group_id, "batch"), TopicPartition(topic, 0), offsets["claimed-meanwhile"] + 1
            )
            return found

    retries = RetrySigner.from_settings(fleet.retry_key_file, tmp_path, fleet.max_attempts)
    reads = KafkaQueueReads(fleet)  # the real reads: what only a broker shows is their offsets and records
    announcer = ClaimedWhileRead(
        fleet, FleetView(fleet), Publisher(fleet, producer), Partitions(FakeConsumer()), retries, reads
    )
    assert await announcer.announce() == 1
    queued = [parse_event(sent.value) for sent in producer.sent if sent.topic == fleet.events_topic]
    # Placed without the claimed one: first, to start now on the fleet's one free slot.
    assert [(type(event), event.request_id, event.place, event.eta_s) for event in queued] == [
        (Queued, "still-waiting", 1, 0.0)
    ]
    # Read again with nothing claimed since: the one told already is not told twice.
    plain = Announcer(fleet, announcer.view, Publisher(fleet, producer), Partitions(FakeConsumer()), retries, reads)
    assert await plain.announce() == 0
    await reads.close()


async def test_the_queue_reads_keep_their_clients_between_reads_and_go_on_past_what_they_read(
    settings: Settings,
) -> None:
    """Issue 59: the announcer's reads made an admin client and a reader for each read, every two seconds (a tenth of
    a core at rest with 10,000 waiting): they are kept open, placed again each read, and read what came since; a
    topic deleted is TopicMissing (the announcer forgets what it read of it), and `close` closes them all."""
    topic = f"queue-{settings.group_id}"
    await ensure_topics(settings.model_copy(update={"requests_topic": topic}), partitions=2)
    reads = KafkaQueueReads(settings)
    try:
        for n in range(3):
            await produce(settings, f"r{n}".encode(), f"k{n}".encode(), topic=topic)
        found = await reads.waiting(topic, {}, 10)
        assert sorted(r.value for r in found) == [b"r0", b"r1", b"r2"]
        admin, reader = reads.admin, reads.readers[topic]
        await produce(settings, b"r3", b"k0", topic=topic)
        after = {r.partition: r.offset + 1 for r in found}  # where a round goes on from
        again = await reads.waiting(topic, after, 10)
        assert [r.value for r in again] == [b"r3"]
        assert (reads.admin, reads.readers[topic]) == (admin, reader)  # the same clients, placed again
        assert len(await reads.waiting(topic, {}, 2)) == 2  # at most `most`, from the beginning again
        committed = await reads.committed([(queue_group(settings.group_id, "x"), topic)])
        assert committed == {(queue_group(settings.group_id, "x"), topic): {}}
        assert reads.admin is admin
        admin_client = AIOKafkaAdminClient(**kafka_options(settings))
        await admin_client.start()
        try:
            await admin_client.delete_topics([topic])
        finally:
            await admin_client.close()
        with pytest.raises(TopicMissing):
            await reads.waiting(topic, {}, 10)
        assert topic not in reads.readers
    finally:
        await reads.close()
    assert reads.admin is None and not reads.readers


async def test_a_request_whose_cancel_this_host_has_read_is_not_told_it_waits_nor_counted_in_the_others_places(
    tmp_path: Path,
) -> None:
    """Issue 57: a request cancelled while unread was told its place, and counted in the others', until a host with
    room reached it. On the in-memory fakes: the queues as read are given, and none claimed meanwhile."""
    fleet = Settings(
        work_dir=tmp_path,
        priority_classes=CLASSES,
        default_priority_class="batch",
        claims_topic="claims",
        **shared_fleet_keys(),
    )
    topic = fleet.class_topics["batch"]
    producer = FakeProducer()
    read = []
    for offset, name in enumerate(("cancelled-1", "still-waiting")):
        request = decode_request(json.dumps(sft_request(name, priority_class="batch")).encode(), name.encode())
        assert isinstance(request, RequestBase)
        events = JobEvents(Publisher(fleet, producer), request, fleet.host, 1, [])
        read.append(Unread(waiting_for(request, "batch", 1_765_000_000.0 + offset), (topic, 0, offset), events))

    class AsRead(Announcer):
        async def unread(self) -> list[Unread]:
            return read

        async def claimed(self, records: Iterable[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
            return set()

    retries = RetrySigner.from_settings(fleet.retry_key_file, tmp_path, fleet.max_attempts)
    announcer = AsRead(
        fleet,
        FleetView(fleet),
        Publisher(fleet, producer),
        Partitions(FakeConsumer()),
        retries,
        FakeFleetKafka(),
        cancelled={"cancelled-1"},
    )
    assert await announcer.announce() == 1
    queued = [parse_event(sent.value) for sent in producer.sent if sent.topic == fleet.events_topic]
    assert [(event.request_id, event.place) for event in queued] == [
        ("still-waiting", 1)
    ]  # first: cancelled-1 is not ahead of it


MODEL = sft_request("x")["model"]["id"]


def unread_request(announcer: Announcer, request_id: str, priority_class: str, offset: int, arrived: float) -> Unread:
    value = json.dumps(sft_request(request_id, priority_class=priority_class)).encode()
    request = decode_request(value, request_id.encode())
    assert isinstance(request, RequestBase)
    events = JobEvents(announcer.publisher, request, announcer.settings.host, 1, [])
    where = (announcer.settings.class_topics[priority_class], 0, offset)
    return Unread(waiting_for(request, priority_class, arrived), where, events)


class Backlog(Announcer):
    """The announcer over a backlog kept in memory: its unread requests are `backlog`, none claimed meanwhile."""

    backlog: list[Unread]

    async def unread(self) -> list[Unread]:
        return list(self.backlog)

    async def claimed(self, records: Iterable[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
        return set()


async def test_a_waiting_request_is_told_again_when_a_higher_class_goes_ahead(tmp_path: Path) -> None:
    """Issue 57: a `queued` event's place and ETA were never revised (told 14-33 s, waited 44-96 s). batch-1 was told,
    by this host's announcer 12 s ago (its event read back), that it starts in 42 s, when run-1 ends on the fleet's one
    slot; it is still right. Then urgent-1 arrives: it goes first, for its 100 s, and batch-1 is told again: place 2,
    ETA 130 s."""
    fleet = Settings(priority_classes=CLASSES, default_priority_class="batch", work_dir=tmp_path, **shared_fleet_keys())
    now = time.time()
    view = FleetView(fleet)
    view.observe(
        read(
            Accepted(
                request_id="run-1",
                method="sft",
                team="a",
                priority_class="batch",
                host_slots=1,
                model=MODEL,
                host="gpu-b",
                time=datetime.fromtimestamp(now - 60, UTC),
            )
        ),
        now,
    )
    view.observe(
        read(
            Progress(
                request_id="run-1",
                step=10,
                total_steps=50,
                eta_s=30.0,
                host="gpu-b",
                time=datetime.fromtimestamp(now, UTC),
            )
        ),
        now,
    )
    view.observe(
        read(
            Queued(
                request_id="batch-1",
                priority_class="batch",
                team="default",
                place=1,
                eta_s=42.0,
                host=fleet.host,
                time=datetime.fromtimestamp(now - 12, UTC),
            )
        ),
        now,
    )
    view.durations.add("sft", MODEL, 100.0)  # no steps said: every job of the kind is expected at 100 s
    producer = FakeProducer()
    announcer = Backlog(
        fleet,
        view,
        Publisher(fleet, producer),
        Partitions(FakeConsumer()),
        RetrySigner.from_settings(fleet.retry_key_file, tmp_path, fleet.max_attempts),
        FakeFleetKafka(),
    )
    announcer.backlog = [unread_request(announcer, "batch-1", "batch", 0, now - 20)]
    assert await announcer.announce() == 0  # its ETA counted down as it should: nothing new
    announcer.backlog.append(unread_request(announcer, "urgent-1", "urgent", 0, now - 1))
    assert await announcer.announce() == 2
    queued = {
        event.request_id: (event.place, event.eta_s)
        for event in map(parse_event, (sent.value for sent in producer.sent))
    }
    assert queued == {"urgent-1": (1, pytest.approx(30.0, abs=1)), "batch-1": (2, pytest.approx(130.0, abs=1))}
    assert await announcer.announce() == 0  # told; and within RETELL_EVERY_S of it besides
