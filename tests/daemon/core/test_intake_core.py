"""Intake, partitions and the publisher on the in-memory Kafka clients (tests/fakes.py): every
hostile record of issue 22 becomes a DLQ record and a `rejected` event under its key, in order; the
partition is committed past the last one only once every acknowledgement has come, and not at all
when one fails (the records are read again). No broker, no child: milliseconds."""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
from pathlib import Path
from typing import cast

import pytest
from aiokafka import TopicPartition
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from daemon import decoding
from daemon import intake as intake_module
from daemon.admission.judge import refusal
from daemon.cli.demo.requests import VISION_CHAT_ROWS
from daemon.kafka.records import Record
from daemon.settings import Settings
from schemas import FieldError, Rejection, RequestBase
from tests.core import CoreOnFakes
from tests.fakes import FakeProducer, FakeRecord
from tests.helpers import sft_request
from tests.hostile import hostile_cases


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (tmp_path / "outside").mkdir()
    (data / "link").symlink_to(tmp_path / "outside")
    return data


@pytest.fixture
def settings(tmp_path: Path, root: Path) -> Settings:
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        allowed_local_dataset_roots=[root],
        allowed_dataset_urls=["s3://bucket/*"],
        allowed_report_to=["mlflow", "tensorboard", "trackio"],
    )


def hostile_records(settings: Settings, root: Path, tp: TopicPartition) -> tuple[list[FakeRecord], list[str]]:
    cases = hostile_cases(sft_request("valid"), Path("/tmp/root"))
    records = [
        FakeRecord(
            tp.topic,
            tp.partition,
            offset,
            f"hostile-{name}".encode(),
            raw.replace(b"/tmp/root", str(root).encode()),
            headers,
        )
        for offset, (name, raw, headers, _) in enumerate(cases, start=100)
    ]
    return records, [path for _, _, _, path in cases]


async def test_every_hostile_record_is_dead_lettered_and_announced_then_committed(
    settings: Settings, root: Path
) -> None:
    core = CoreOnFakes(settings, FakeProducer())
    tp = TopicPartition(settings.requests_topic, 0)
    records, paths = hostile_records(settings, root, tp)

    await core.intake.take(tp, records)
    await core.partitions.settled(tp)

    dead = core.producer.on(settings.dlq_topic)
    events = core.producer.on(settings.events_topic)
    assert [m.key for m in dead] == [r.key for r in records] and [m.value for m in dead] == [r.value for r in records]
    assert [m.header("adapterd-source-offset") for m in dead] == [str(r.offset).encode() for r in records]
    assert [json.loads(m.value)["type"] for m in events] == ["rejected"] * len(records)
    for event, path in zip(events, paths, strict=True):  # each names the field its case is about
        assert path in [error["path"] for error in json.loads(event.value)["errors"]], event.value[:300]
    assert core.consumer.commits == [(tp, records[-1].offset + 1)]  # once, past the last
    assert core.producer.batches <= 4  # rejections go out in batches, not one send each


async def test_nothing_is_committed_before_the_acknowledgements_or_when_one_fails(
    settings: Settings, root: Path
) -> None:
    core = CoreOnFakes(settings, FakeProducer(hold_acks=True))
    tp = TopicPartition(settings.requests_topic, 0)
    records, _ = hostile_records(settings, root, tp)
    first, second = records[:5], records[5:10]

    await core.intake.take(tp, first)
    await asyncio.sleep(0)  # let the settle task reach its wait on the acknowledgements
    assert core.consumer.commits == []
    core.producer.release()
    await core.partitions.settled(tp)
    assert core.consumer.commits == [(tp, first[-1].offset + 1)]

    await core.intake.take(tp, second)
    core.producer.release(ConnectionError("the broker went away"))
    await core.partitions.settled(tp)
    assert core.consumer.commits == [(tp, first[-1].offset + 1)]  # the second batch is read again after a restart


async def test_the_loop_turns_between_records_of_a_batch(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch of small records that are all rejected awaits nothing but the flush at its end; the
    loop's other work (aiokafka's heartbeats, the watchdog's feeding) gets a turn between records,
    at least every TURN_EVERY_S (here 0: at every record, so that the count does not hang on the clock)."""
    monkeypatch.setattr(intake_module, "TURN_EVERY_S", 0.0)
    core = CoreOnFakes(settings, FakeProducer())
    tp = TopicPartition(settings.requests_topic, 0)
    records = [FakeRecord(tp.topic, 0, offset, b"k", b"{not json") for offset in range(50)]
    turns = [0]

    async def other_work() -> None:  # what the loop does beside intake, one step a turn
        while True:
            turns[0] += 1
            await asyncio.sleep(0)

    beside = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = turns[0]
    await core.intake.take(tp, records)
    beside.cancel()
    assert turns[0] - before >= len(records)  # a turn for each record, not one for the batch
    assert len(core.dead_letters()) == len(records)


async def test_a_batch_gives_the_loop_a_turn_before_its_first_record_and_then_every_turn_every_s(
    settings: Settings,
) -> None:
    core = CoreOnFakes(settings, FakeProducer())
    records = [FakeRecord(core.tp.topic, 0, offset, b"k", b"{not json") for offset in range(5)]
    turned = asyncio.Event()

    async def other_work() -> None:
        turned.set()

    beside = asyncio.create_task(other_work())  # ready, not yet run: it runs at intake's first turn
    await core.intake.take(core.tp, records)
    assert turned.is_set() and beside.done()
    assert 0 < intake_module.TURN_EVERY_S <= 0.05  # far inside the heartbeat (3 s) and the watchdog (30 s)
    assert len(core.dead_letters()) == len(records)


async def test_a_partition_that_moves_away_between_records_is_left_to_its_new_member(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(intake_module, "TURN_EVERY_S", 0.0)  # a turn at every record: the move lands between two
    core = CoreOnFakes(settings, FakeProducer())
    records = [FakeRecord(core.tp.topic, 0, offset, b"k", b"{not json") for offset in range(10)]

    async def rebalance() -> None:  # a rebalance that moves the partition away after three of intake's turns
        for _ in range(3):
            await asyncio.sleep(0)
        del core.consumer.committed[core.tp]

    moving = asyncio.create_task(rebalance())
    await core.intake.take(core.tp, records)
    await moving
    decided = len(core.dead_letters())
    assert 0 < decided < len(records)  # those taken before it moved were decided; none after


async def test_a_request_with_images_is_judged_in_a_thread_of_the_admission_pool_and_others_on_the_loop(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`judge.refusal` is the whole decision, and intake takes its verdict: its checks that read no
    image on the loop (microseconds: a thread's hop would cost more), the images' off it, and only for
    a request those checks let through."""
    seen: dict[str, list[tuple[str, str]]] = {}

    def before_images(request: RequestBase, host: Settings, slots: object) -> Rejection | None:
        assert host is settings and slots is core.slots
        seen.setdefault(request.request_id, []).append(("before_images", threading.current_thread().name))
        return (
            None
            if request.request_id == "pictured"
            else Rejection("policy", [FieldError(path="model.id", message="not this one")], request.request_id)
        )

    def images(request: RequestBase, host: Settings) -> Rejection | None:
        assert host is settings
        seen.setdefault(request.request_id, []).append(("images", threading.current_thread().name))
        return Rejection("policy", [FieldError(path="model.id", message="not this one")], request.request_id)

    monkeypatch.setattr(intake_module, "refusal_before_images", before_images)
    monkeypatch.setattr(intake_module, "image_refusal", images)
    core = CoreOnFakes(settings, FakeProducer())
    plain, pictured = sft_request("plain"), sft_request("pictured", dataset={"rows": VISION_CHAT_ROWS})
    refused = sft_request("refused", dataset={"rows": VISION_CHAT_ROWS})  # refused before its images are read
    await core.intake.take(
        core.tp,
        [
            FakeRecord(core.tp.topic, 0, offset, request["request_id"].encode(), json.dumps(request).encode())
            for offset, request in enumerate([plain, pictured, refused])
        ],
    )
    await core.partitions.settled(core.tp)
    main = threading.main_thread().name
    assert seen["plain"] == [("before_images", main)] and seen["refused"] == [("before_images", main)]
    assert seen["pictured"][0] == ("before_images", main) and seen["pictured"][1][0] == "images"
    assert seen["pictured"][1][1].startswith("adapterd-admission")
    for request_id in ("plain", "pictured"):
        [event] = core.events(request_id)
        assert (
            event["type"] == "rejected"
            and event["reason"] == "policy"
            and [e["path"] for e in event["errors"]] == ["model.id"]
        )


async def test_a_partition_that_moves_away_while_a_large_record_is_decoded_off_the_loop_is_left_there(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Intake looks at the partition's assignment after each of its awaits, not at every record it
    decides on the loop: a move during a large record's decode in a thread stops the batch after it."""
    monkeypatch.setattr(intake_module, "TURN_EVERY_S", 3600.0)  # no turn but the batch's first
    core = CoreOnFakes(settings, FakeProducer())
    decoded_off_loop = decoding.decoded

    async def decoded_while_moving(record: Record, max_message_bytes: int) -> RequestBase | Rejection:
        del core.consumer.committed[core.tp]  # the rebalance lands while the record is decoded
        return await decoded_off_loop(record, max_message_bytes)

    monkeypatch.setattr(decoding, "decoded", decoded_while_moving)
    large = b"{not json " + b"x" * decoding.OFF_LOOP_BYTES
    records = [
        FakeRecord(core.tp.topic, 0, offset, b"k", value)
        for offset, value in enumerate([b"{not json", large, b"{not json", b"{not json"])
    ]
    await core.intake.take(core.tp, records)
    assert [m.header("adapterd-source-offset") for m in core.dead_letters()] == [b"0", b"1"]  # none after the move


async def test_a_partition_that_moves_away_while_images_are_judged_off_the_loop_is_left_there(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(intake_module, "TURN_EVERY_S", 3600.0)
    core = CoreOnFakes(settings, FakeProducer())
    judged_off_loop = intake_module.judged_images

    async def judged_while_moving(request: RequestBase, host: Settings) -> Rejection | None:
        del core.consumer.committed[core.tp]
        return await judged_off_loop(request, host)

    monkeypatch.setattr(intake_module, "judged_images", judged_while_moving)
    pictured = json.dumps(
        sft_request("pictured", dataset={"rows": [{**VISION_CHAT_ROWS[0], "images": [NOT_AN_IMAGE]}]})
    ).encode()
    records = [
        FakeRecord(core.tp.topic, 0, offset, b"k", value) for offset, value in enumerate([pictured, b"{not json"])
    ]
    await core.intake.take(core.tp, records)
    assert [m.header("adapterd-source-offset") for m in core.dead_letters()] == [b"0"]
    [event] = core.events("pictured")
    assert event["reason"] == "invalid" and event["errors"][0]["path"] == "dataset.rows.0.images.0"  # type: ignore[index]


NOT_AN_IMAGE = "data:image/png;base64,aGVsbG8gd29ybGQh"  # "hello world!"

# Records of every way intake decides one: on the loop (small, without images) or off it (a large
# record decoded in a thread, a request whose images are judged in one).
_RECORD_KINDS: dict[str, bytes] = {
    "not_json": b"{not json",
    "unknown_field": json.dumps(sft_request("unknown", training={"learning_rat": 1})).encode(),
    "too_many_gpus": json.dumps(sft_request("gpus", resources={"gpus": 64})).encode(),
    "policy": json.dumps(sft_request("policy", dataset={"path": "/etc/passwd"})).encode(),
    "credential": json.dumps(sft_request("secret", metadata={"note": "hf_" + "a1B2" * 9})).encode(),
    "large": json.dumps(sft_request("large", metadata={"note": "x" * 70_000}, training={"learning_rat": 1})).encode(),
    "images_refused": json.dumps(
        sft_request("pictured", dataset={"rows": VISION_CHAT_ROWS}, resources={"gpus": 64})
    ).encode(),
    "images_policy": json.dumps(
        sft_request(
            "pictured-policy",
            model={"id": "x/y", "trust_remote_code": True},
            dataset={"rows": [{**VISION_CHAT_ROWS[0], "images": [NOT_AN_IMAGE]}]},
        )
    ).encode(),
    "bad_image": json.dumps(
        sft_request("broken", dataset={"rows": [{**VISION_CHAT_ROWS[0], "images": [NOT_AN_IMAGE]}]})
    ).encode(),
}


@hypothesis_settings(max_examples=30, deadline=None)
@given(kinds=st.lists(st.sampled_from(sorted(_RECORD_KINDS)), min_size=1, max_size=12))
def test_a_batch_decided_inline_gets_the_verdicts_decoded_and_refusal_give_each_record(
    kinds: list[str],
) -> None:
    """take's inline path for small records is `decoding.decoded` without its coroutine, and its
    admission is `judge.refusal` in two parts (the images' read only for a request the rest lets
    through): every record of any mix gets the rejection they give it alone."""
    with tempfile.TemporaryDirectory() as work:
        host = Settings(gpus=[], warm_child=False, work_dir=Path(work), allowed_local_dataset_roots=[Path(work)])
        asyncio.run(_inline_against_alone(host, kinds))


async def _inline_against_alone(host: Settings, kinds: list[str]) -> None:
    core = CoreOnFakes(host, FakeProducer())
    records = [
        FakeRecord(core.tp.topic, 0, offset, f"k-{offset}".encode(), _RECORD_KINDS[kind])
        for offset, kind in enumerate(kinds)
    ]
    await core.intake.take(core.tp, records)
    await core.partitions.settled(core.tp)
    expected = []
    for record in records:
        decoded = await decoding.decoded(record, host.max_message_bytes)
        rejection = (
            decoded if isinstance(decoded, Rejection) else refusal(decoded, host, core.slots)
        )  # the whole decision, in one call
        assert rejection is not None
        expected.append((rejection.reason, [(error.path, error.message) for error in rejection.bounded().errors]))
    got = [
        (event["reason"], [(error["path"], error["message"]) for error in cast(list[dict[str, str]], event["errors"])])
        for event in core.events()
    ]
    assert got == expected


async def test_a_rejection_is_logged_and_its_letter_and_event_carry_the_records_trace_context(
    settings: Settings,
) -> None:
    """The logger is bound once a batch and the trace context read once a rejection, for the DLQ
    record and the event alike: each rejection still logs, and each copy carries the trace."""
    core = CoreOnFakes(settings, FakeProducer())
    parent = b"00-" + b"a" * 32 + b"-" + b"b" * 16 + b"-01"
    records = [
        FakeRecord(core.tp.topic, 0, offset, f"traced-{offset}".encode(), b"{not json", [("traceparent", parent)])
        for offset in range(3)
    ]
    with capture_logs() as logs:
        await core.intake.take(core.tp, records)
    assert [
        (entry["event"], entry["offset"], entry["reason"]) for entry in logs if entry["event"] == "request.rejected"
    ] == [("request.rejected", offset, "not_json") for offset in range(3)]
    assert [m.header("traceparent") for m in core.dead_letters()] == [parent] * 3
    assert [m.header("traceparent") for m in core.producer.on(settings.events_topic)] == [parent] * 3
