"""Every part of a record is input (issue 37): headers of any name and value (null, not UTF-8, the
daemon's own names forged, thousands of them), a null or non-UTF-8 key, any timestamp. Each record
ends in a rejection (DLQ, event, commit) or a job with one terminal event; nothing raises out of
intake, and an exception while deciding about a record is an `internal` rejection, never an exit.
A record the client cannot read (a header name not UTF-8; a batch in a codec it cannot decompress or a
corrupt one, issue 61) is rejected by its offset. On the in-memory fakes (tests/core.py): milliseconds each."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path

import pytest
from aiokafka import TopicPartition
from aiokafka.errors import CorruptRecordException, KafkaConnectionError, UnsupportedCodecError

from daemon.intake import Intake
from daemon.kafka.retry_state import ATTEMPT_HEADER, DUE_HEADER, RETRY_HEADERS, SIGNATURE_HEADER
from daemon.kafka.unreadable import unreadable
from daemon.ops import metrics
from daemon.service import Service
from daemon.settings import Settings
from tests.core import CoreOnFakes
from tests.daemon.core.test_scheduler_core import SUCCEEDS
from tests.fakes import FakeChildren, FakeConsumer, FakeProducer, FakeRecord
from tests.helpers import sft_request

Headers = list[tuple[str, bytes | None]]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        max_attempts=2,
        retry_backoff_s=30,
        progress_interval_s=0,
    )


HOSTILE_HEADERS: dict[str, Headers] = {
    "null-attempt": [(ATTEMPT_HEADER, None)],
    "null-retry-headers": [(name, None) for name in RETRY_HEADERS],
    "null-signature": [(ATTEMPT_HEADER, b"2"), (DUE_HEADER, b"0"), (SIGNATURE_HEADER, None)],
    "binary-retry-headers": [(name, b"\xff\xfe\x00") for name in RETRY_HEADERS],
    "null-trace": [("traceparent", None), ("tracestate", None)],
    "binary-trace": [("traceparent", b"\xff" * 55), ("tracestate", b"\x80")],
    "null-other": [("x-anything", None), ("", None), ("adapterd-reason", None)],
    "many": [(f"h{index}", None if index % 2 else b"\xff") for index in range(5000)],
    "duplicates": [(ATTEMPT_HEADER, b"99"), (ATTEMPT_HEADER, None), (ATTEMPT_HEADER, b"1")],
}


async def take_one(core: CoreOnFakes, record: FakeRecord) -> None:
    await core.intake.take(core.tp, [record])
    await core.partitions.settled(core.tp)
    job = core.scheduler.jobs.get(core.tp)
    if job is not None:
        await job.task


@pytest.mark.parametrize("name", sorted(HOSTILE_HEADERS))
async def test_a_valid_request_with_hostile_headers_runs_as_a_first_attempt(settings: Settings, name: str) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    record = FakeRecord(core.tp.topic, 0, 3, b"r1", json.dumps(sft_request("r1")).encode(), HOSTILE_HEADERS[name])
    await take_one(core, record)
    events = core.events("r1")
    assert events and events[0]["type"] == "accepted" and events[0]["attempt"] == 1
    assert [event["type"] for event in events][-1] == "succeeded"
    assert core.consumer.committed[core.tp] == 4


@pytest.mark.parametrize("name", sorted(HOSTILE_HEADERS))
async def test_an_invalid_request_with_hostile_headers_is_dead_lettered_and_committed(
    settings: Settings, name: str
) -> None:
    core = CoreOnFakes(settings)
    record = FakeRecord(core.tp.topic, 0, 3, b"r1", b'{"request_id": "r1"}', HOSTILE_HEADERS[name])
    await take_one(core, record)
    assert core.types("r1") == ["rejected"] and len(core.dead_letters()) == 1
    assert all(value is not None for _, value in core.dead_letters()[0].headers)  # no null of the producer's carried
    assert core.consumer.committed[core.tp] == 4


@pytest.mark.parametrize("key", [None, b"\xff\xfe", b"", b"r1\x00"])
async def test_any_key_ends_in_one_outcome(settings: Settings, key: bytes | None) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    valid = FakeRecord(core.tp.topic, 0, 3, key, json.dumps(sft_request("r1")).encode())
    invalid = FakeRecord(core.tp.topic, 0, 4, key, b"not json")
    await take_one(core, valid)
    await take_one(core, invalid)
    assert core.types("r1")[-1] == "succeeded"
    assert [json.loads(m.value)["type"] for m in core.producer.on(settings.events_topic)].count("rejected") == 1
    assert core.consumer.committed[core.tp] == 5


@pytest.mark.parametrize("timestamp", [-1, 0, 2**63 - 1, -(2**63)])
async def test_any_timestamp_ends_in_one_terminal_event(settings: Settings, timestamp: int) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    record = FakeRecord(core.tp.topic, 0, 3, b"r1", json.dumps(sft_request("r1")).encode(), timestamp=timestamp)
    await take_one(core, record)
    assert core.types("r1")[0] == "accepted" and core.types("r1")[-1] == "succeeded"
    assert core.consumer.committed[core.tp] == 4


async def test_an_exception_while_offering_a_request_is_an_internal_rejection(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = CoreOnFakes(settings)

    async def broken(*args: object, **kwargs: object) -> object:
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(core.scheduler, "offer", broken)
    before = metrics.INTAKE_ERRORS.labels("RuntimeError")._value.get()
    first = FakeRecord(core.tp.topic, 0, 3, b"r1", json.dumps(sft_request("r1")).encode())
    second = FakeRecord(core.tp.topic, 0, 4, b"r2", b"{}")
    await core.intake.take(core.tp, [first, second])  # raises nothing
    await core.partitions.settled(core.tp)
    rejected = core.events("r1")
    assert [event["type"] for event in rejected] == ["rejected"] and rejected[0]["reason"] == "internal"
    assert [m.header("adapterd-reason") for m in core.dead_letters()] == [b"internal"]
    assert core.consumer.committed[core.tp] == 4 and core.consumer.sought[core.tp] == 4  # read on from the next record
    assert core.tp not in core.consumer.paused
    await core.intake.take(core.tp, [second])
    await core.partitions.settled(core.tp)
    assert core.consumer.committed[core.tp] == 5
    assert metrics.INTAKE_ERRORS.labels("RuntimeError")._value.get() == before + 1


class YieldingConsumer(FakeConsumer):
    """A fake consumer whose poll gives the loop's other tasks a turn, as a real one's network wait does."""

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, list[FakeRecord]]:
        await asyncio.sleep(0)
        return await super().getmany(*partitions, timeout_ms=timeout_ms, max_records=max_records)


async def test_no_exception_leaves_the_service_loop(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = YieldingConsumer()
    service = Service(settings, consumer=consumer, producer=FakeProducer())  # type: ignore[arg-type]
    tp = TopicPartition(settings.requests_topic, 0)
    consumer.records[tp] = [FakeRecord(tp.topic, 0, 5, b"r1", b"{}")]
    turned = asyncio.Event()

    async def broken(self: Intake, *args: object) -> None:
        turned.set()
        raise RuntimeError("a bug of ours outside any record's decision")

    monkeypatch.setattr(Intake, "take", broken)
    loop = asyncio.create_task(service._poll_until_stopped())
    await turned.wait()
    await asyncio.sleep(0)
    assert not loop.done()  # the loop goes on
    assert consumer.sought[tp] == 5  # and reads the batch again
    service.stop_requested.set()
    await loop


async def test_each_record_case_is_rejected_naming_its_field(settings: Settings) -> None:
    """tests/hostile.py's `record_cases` on the fakes, as the end-to-end test sends them to a daemon."""
    from daemon.cli.demo.requests import VISION_CHAT_ROWS
    from daemon.kafka.copies import COPY_HEADROOM_BYTES
    from tests.hostile import record_cases

    limit = 131_072
    core = CoreOnFakes(settings.model_copy(update={"max_message_bytes": limit}))
    cases = record_cases(sft_request("valid"), VISION_CHAT_ROWS, limit - COPY_HEADROOM_BYTES)
    records = [
        FakeRecord(core.tp.topic, 0, offset, f"record-{name}".encode(), raw, list(headers))
        for offset, (name, raw, headers, _) in enumerate(cases)
    ]
    await core.intake.take(core.tp, records)
    await core.partitions.settled(core.tp)
    for name, _, _, path in cases:
        [event] = core.events(f"record-{name}")
        assert event["type"] == "rejected" and path in [error["path"] for error in event["errors"]], (name, event)
    assert core.consumer.committed[core.tp] == len(cases)


UNREADABLE = b"<a header name that is not UTF-8>"


class AiokafkaLikeConsumer(YieldingConsumer):
    """Reads a log by position, as aiokafka does, including what it does with a record it cannot
    unpack (a header name that is not UTF-8, a batch it cannot decompress): the call raises `error`,
    the records of the same call before it are lost (other partitions' positions already moved past
    theirs), and the next call moves past the lost ones of its own partition too, unless the
    partition is sought first."""

    def __init__(self, log: dict[TopicPartition, list[FakeRecord]], error: Exception | None = None) -> None:
        super().__init__()
        self.log = log
        self.error = error if error is not None else UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        self.position_of = {tp: 0 for tp in log}
        self.skip_to: dict[TopicPartition, int] = {}
        self.committed.update({tp: 0 for tp in log})

    def seek(self, tp: TopicPartition, offset: int) -> None:
        super().seek(tp, offset)
        self.position_of[tp] = offset
        self.skip_to.pop(tp, None)

    async def position(self, tp: TopicPartition) -> int:
        return self.position_of[tp]

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int, max_records: int
    ) -> Mapping[TopicPartition, list[FakeRecord]]:
        await asyncio.sleep(0)
        batches: dict[TopicPartition, list[FakeRecord]] = {}
        for tp in sorted(self.log, key=lambda tp: tp.partition):
            if (partitions and tp not in partitions) or tp in self.paused:
                continue
            if tp in self.skip_to:
                self.position_of[tp] = self.skip_to.pop(tp)
            batch = [r for r in self.log[tp] if r.offset >= self.position_of[tp]][:max_records]
            bad = next((r for r in batch if r.value == UNREADABLE), None)
            if bad is not None:
                self.skip_to[tp] = bad.offset  # the dead iterator: its good records are skipped next time
                raise self.error
            if batch:
                batches[tp] = batch
                self.position_of[tp] = batch[-1].offset + 1
                max_records -= len(batch)
        return batches


def test_kafkas_errors_of_a_batch_are_a_records_doing_and_its_others_are_not() -> None:
    """The step-past decision: what aiokafka raises while it unpacks a batch is stepped past; an error of
    the brokers or the group is not (the poll raises it, as before)."""
    assert unreadable(UnsupportedCodecError("Libraries for lz4 compression codec not found"))
    assert unreadable(UnsupportedCodecError("Unknown compression codec 0x05"))
    assert unreadable(CorruptRecordException("Invalid CRC"))
    assert unreadable(UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"))
    assert not unreadable(KafkaConnectionError())
    assert not unreadable(asyncio.CancelledError())


UNREADABLE_CASES = {
    # A header name aiokafka cannot decode: one record.
    "header-name": (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), [3]),
    # A batch of two records in a codec this host has no library for, or one Kafka adds later: each record of it.
    "codec": (UnsupportedCodecError("Libraries for lz4 compression codec not found"), [3, 4]),
    "corrupt": (CorruptRecordException("Invalid CRC - requests-1"), [3]),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE_CASES))
async def test_a_record_the_client_cannot_read_is_stepped_past_and_nothing_else_is_lost(
    settings: Settings, case: str
) -> None:
    error, unread_offsets = UNREADABLE_CASES[case]
    first, second = TopicPartition(settings.requests_topic, 0), TopicPartition(settings.requests_topic, 1)
    log = {
        first: [FakeRecord(first.topic, 0, offset, b"k", b"{}") for offset in range(5)],
        second: [FakeRecord(second.topic, 1, offset, b"k", b"{}") for offset in range(6)],
    }
    for offset in unread_offsets:
        log[second][offset] = FakeRecord(second.topic, 1, offset, b"k", UNREADABLE)
    consumer = AiokafkaLikeConsumer(log, error)
    service = Service(settings, consumer=consumer, producer=FakeProducer())
    service.partitions.on_assigned({first, second})
    loop = asyncio.create_task(service._poll_until_stopped())
    async with asyncio.timeout(10):
        while consumer.committed != {first: 5, second: 6}:
            await asyncio.sleep(0)
    service.stop_requested.set()
    await loop
    dead = service.publisher.producer.on(settings.dlq_topic)  # type: ignore[attr-defined]
    offsets = sorted(
        (int(m.header("adapterd-source-partition")), int(m.header("adapterd-source-offset"))) for m in dead
    )
    assert offsets == [(0, n) for n in range(5)] + [(1, n) for n in range(6)]  # each once: none lost, none twice
    unread = [m for m in dead if m.header("adapterd-exception") == type(error).__name__.encode()]
    assert [int(m.header("adapterd-source-offset")) for m in unread] == unread_offsets and all(
        m.value == b"" for m in unread
    )
