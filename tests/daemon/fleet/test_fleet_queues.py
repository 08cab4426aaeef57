"""The dispatcher's parts that need no broker (issue 47): a queue partition's window (a request that may not
start holds up none behind it; what is taken from inside the window takes the records before it along,
to be written again; a record the client cannot read takes its place in it, to be rejected: issue 61),
a claimed request's class, and the signed count of preemptions."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import UnsupportedCodecError

from daemon.fleet.choice import Head, HeadReader
from daemon.fleet.claimed import claimed_class
from daemon.fleet.moves import Move, Mover, Stale, kept_timestamp
from daemon.fleet.queues import WINDOW, ClassQueue, QueueListener
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.kafka.unreadable import UnreadableRecord
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER
from schemas import REQUEST_MODELS
from testbed.fleet_keys import shared_fleet_keys
from testbed.memory_kafka import FakeRecord
from tests.fakes import FakeFleetKafka
from tests.helpers import sft_request

TP = TopicPartition("adapterd.requests.batch", 0)
CLASSES = [{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}]


class WindowConsumer:
    """The calls ClassQueue makes of an aiokafka consumer, over one partition's records."""

    def __init__(self, records: list[FakeRecord]) -> None:
        self.records = records
        self.position = 0
        self.paused = False
        self.seeks: list[int] = []

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Record]]:
        if self.paused:
            return {}
        batch = [r for r in self.records if r.offset >= self.position][:max_records]
        if batch:
            self.position = batch[-1].offset + 1
        return {TP: batch} if batch else {}

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self.seeks.append(offset)
        self.position = offset

    def pause(self, tp: TopicPartition) -> None:
        self.paused = True

    def resume(self, tp: TopicPartition) -> None:
        self.paused = False

    def assignment(self) -> set[TopicPartition]:
        return {TP}

    def highwater(self, tp: TopicPartition) -> int:
        return len(self.records)


def queue_over(count: int) -> tuple[ClassQueue, WindowConsumer]:
    records = [
        FakeRecord(TP.topic, 0, offset, f"r{offset}".encode(), b"{}", timestamp=1000 * offset)
        for offset in range(count)
    ]
    consumer = WindowConsumer(records)
    queue = ClassQueue("batch", TP.topic, "adapterd.queue.batch", consumer)
    queue.subscribed = queue.joined = True
    return queue, consumer


async def head(queue: ClassQueue, tp: TopicPartition, record: Record) -> Head:
    return Head(record=record, tp=tp, queue=queue.name, group=queue.group, request=None, priority_class="batch")


def unreadable(queue: ClassQueue, tp: TopicPartition, record: UnreadableRecord, exc: BaseException) -> Head:
    raise AssertionError(f"no record of these tests is unreadable ({exc!r} at {record.offset})")


async def test_a_window_holds_the_first_records_of_a_partition_and_pauses_it_when_full() -> None:
    queue, consumer = queue_over(WINDOW + 10)
    await queue.fetch(head, unreadable)
    assert [h.record.offset for h in queue.heads()] == list(range(WINDOW))
    assert consumer.paused and consumer.position == WINDOW  # what did not fit is read again once there is room
    await queue.fetch(head, unreadable)
    assert len(queue.heads()) == WINDOW  # paused: nothing more


async def test_a_request_taken_from_inside_the_window_takes_the_ones_before_it_along_and_the_rest_stay() -> None:
    queue, consumer = queue_over(WINDOW + 10)
    await queue.fetch(head, unreadable)
    third = queue.heads()[2]
    assert [r.offset for r in queue.before(third)] == [0, 1]  # written again at the end, in the move's transaction
    queue.taken(third)
    assert [h.record.offset for h in queue.heads()][:2] == [3, 4] and not consumer.paused
    await queue.fetch(head, unreadable)
    assert [h.record.offset for h in queue.heads()] == list(range(3, WINDOW + 3))  # refilled from where it left off
    first = queue.heads()[0]
    assert queue.before(first) == []


def test_an_impossible_timestamp_is_not_written_again_as_it_was() -> None:
    assert kept_timestamp(1_733_400_000_000) == 1_733_400_000_000
    assert (
        kept_timestamp(-1) is None and kept_timestamp(2**63 - 1) is None
    )  # a producer's; the client would refuse the send


def test_a_claims_class_comes_from_the_dispatchers_header_and_only_a_class_the_fleet_has() -> None:
    settings = Settings(priority_classes=CLASSES, default_priority_class="default", **shared_fleet_keys())
    request = REQUEST_MODELS["sft"].model_validate(sft_request("c1"))
    with_header = FakeRecord("claims", 0, 0, b"c1", b"{}", headers=[(CLASS_HEADER, b"urgent")])
    assert claimed_class(with_header, request, settings) == "urgent"
    forged = FakeRecord("claims", 0, 0, b"c1", b"{}", headers=[(CLASS_HEADER, b"platinum")])
    assert (
        claimed_class(forged, request, settings) == "default"
    )  # not a class: what the request names, else the default
    named = REQUEST_MODELS["sft"].model_validate(sft_request("c2", priority_class="batch"))
    assert claimed_class(FakeRecord("claims", 0, 0, b"c2", b"{}"), named, settings) == "batch"


def test_the_count_of_preemptions_is_read_only_when_a_host_signed_it(tmp_path: Path) -> None:
    signer = RetrySigner.from_settings(None, tmp_path, max_attempts=3)
    value = json.dumps({"request_id": "p1"}).encode()
    signed = signer.preemption_headers(b"p1", value, 2)

    def record(headers: list[tuple[str, Any]], body: bytes = value) -> FakeRecord:
        return FakeRecord("batch", 0, 0, b"p1", body, headers=headers, timestamp=int(time.time() * 1000))

    assert signer.preemptions(record(signed)) == 2
    assert (
        signer.preemptions(record([("adapterd-preemptions", b"99")])) == 0
    )  # a producer's: it would never be preempted
    assert signer.preemptions(record(signed, body=b"another request")) == 0  # moved onto other bytes
    assert signer.preemptions(record([(name, None) for name, _ in signed])) == 0  # null header values
    assert RetrySigner(b"another fleet's key, long enough", 3).preemptions(record(signed)) == 0


async def test_a_move_of_a_record_read_before_a_rebalance_is_not_made_and_a_revocation_waits_for_the_one_in_flight() -> (  # noqa: E501 (the test's name says what it checks)
    None
):
    # aiokafka's transactional offset commit carries no group generation: the host fences itself.
    mover = Mover(Settings(), FakeFleetKafka())
    record = FakeRecord(TP.topic, 0, 5, b"r5", b"{}")
    with pytest.raises(Stale):
        await mover.move(
            Move(record, "adapterd.queue.batch", (), lambda: False)
        )  # never reaches the (unstarted) producer

    queue, _ = queue_over(3)
    order: list[str] = []

    async def settled() -> None:
        order.append(f"settled at generation {queue.generation}")

    queue.settled = settled
    await queue.fetch(head, unreadable)
    read = queue.heads()[0]
    await QueueListener(queue).on_partitions_revoked({TP})
    assert order == ["settled at generation 1"] and queue.windows == {}  # the generation moved first, then the wait
    assert read.generation == 0 != queue.generation  # a move of it now: Dispatcher._ours says no


class CodecConsumer(WindowConsumer):
    """As aiokafka meets a batch compressed with a codec it cannot decompress: the poll that reaches it raises
    (the records fetched with it are lost), on every call until the partition is sought past it."""

    def __init__(self, records: list[FakeRecord], compressed: set[int]) -> None:
        super().__init__(records)
        self.compressed = compressed

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, Sequence[Record]]:
        batch = [r for r in self.records if r.offset >= self.position][:max_records]
        if not self.paused and any(r.offset in self.compressed for r in batch):
            raise UnsupportedCodecError("Unknown compression codec 0x05")
        return await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)


async def test_a_batch_no_codec_reads_takes_its_place_in_the_window_by_offset_to_be_rejected_and_the_rest_is_read() -> (
    None
):
    records = [
        FakeRecord(TP.topic, 0, offset, f"r{offset}".encode(), b"{}", timestamp=1000 * offset) for offset in range(8)
    ]
    consumer = CodecConsumer(records, compressed={3, 4})  # one batch of two records
    queue = ClassQueue("batch", TP.topic, "adapterd.queue.batch", consumer)
    queue.subscribed = queue.joined = True
    for _ in range(20):  # a turn each: the poll that raises, then one record at a time until the batch is met
        await queue.fetch(head, HeadReader.unreadable)
    assert [h.record.offset for h in queue.heads()] == list(range(8))  # none lost, none twice
    rejected = [h for h in queue.heads() if h.rejection is not None]
    assert [h.record.offset for h in rejected] == [3, 4]
    for h in rejected:
        assert isinstance(h.record, UnreadableRecord) and h.rejection is not None
        assert h.rejection.exception == "UnsupportedCodecError" and h.rejection.request_id is None
        assert f"offset {h.record.offset} of {TP.topic}/0" in h.rejection.errors[0].message
