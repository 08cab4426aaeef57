"""The daemon's own copies of a request fit the brokers' largest record (issue 37): a request whose
retry or DLQ copy would not fit is refused at intake naming the limit, and a DLQ copy that could
not carry the record's bytes says so instead of being refused by the broker. On the fakes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka.errors import MessageSizeTooLargeError

from daemon.kafka.clients import Batch
from daemon.kafka.copies import COPY_HEADROOM_BYTES, ERRORS_HEADER_BYTES, errors_header
from daemon.settings import Settings
from schemas import FieldError
from tests.core import CoreOnFakes
from tests.daemon.core.test_scheduler_core import SUCCEEDS, fails
from tests.fakes import FakeChildren, FakeProducer, FakeRecord
from tests.helpers import sft_request

LIMIT = 65_536


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        max_message_bytes=LIMIT,
        progress_interval_s=0,
    )


def sized(request_id: str, size: int) -> bytes:
    """A valid request of exactly `size` bytes (its rows' text padded)."""
    document = sft_request(request_id, dataset={"rows": [{"text": ""}, {"text": "b"}]})
    padding = size - len(json.dumps(document).encode())
    document["dataset"]["rows"][0]["text"] = "a" * padding
    raw = json.dumps(document).encode()
    assert len(raw) == size
    return raw


async def test_a_request_whose_copies_would_not_fit_is_refused_naming_the_limit(settings: Settings) -> None:
    core = CoreOnFakes(settings)
    value = sized("big", LIMIT - COPY_HEADROOM_BYTES - len(b"big") + 1)
    await core.intake.take(core.tp, [FakeRecord(core.tp.topic, 0, 0, b"big", value)])
    await core.partitions.settled(core.tp)
    [event] = core.events("big")
    assert (
        event["type"] == "rejected"
        and event["reason"] == "policy"
        and "max_message_bytes" in event["errors"][0]["message"]
    )
    [dead] = core.dead_letters()
    assert dead.value == b"" and dead.header("adapterd-value-omitted") == str(len(value)).encode()  # said, not lost
    assert core.consumer.committed[core.tp] == 1


async def test_a_request_just_under_the_bound_is_accepted(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    value = sized("fits", LIMIT - COPY_HEADROOM_BYTES - len(b"fits"))
    await core.intake.take(core.tp, [FakeRecord(core.tp.topic, 0, 0, b"fits", value)])
    await core.scheduler.jobs[core.tp].task
    assert core.types("fits")[0] == "accepted" and core.types("fits")[-1] == "succeeded"


async def test_an_invalid_record_too_large_to_copy_is_dead_lettered_without_its_value(settings: Settings) -> None:
    core = CoreOnFakes(settings)
    value = b"x" * LIMIT
    await core.intake.take(core.tp, [FakeRecord(core.tp.topic, 0, 0, b"junk", value)])
    await core.partitions.settled(core.tp)
    [dead] = core.dead_letters()
    assert dead.value == b"" and dead.header("adapterd-value-omitted") == str(LIMIT).encode()
    assert dead.header("adapterd-source-offset") == b"0"  # where the bytes still are


def test_the_dlq_errors_header_is_bounded() -> None:
    errors = [FieldError(path="p" * 256, message="m" * 1000) for _ in range(51)]
    header = errors_header(errors)
    assert len(header) <= ERRORS_HEADER_BYTES and b"more errors" in header


class RefusingRequestsTopic(FakeProducer):
    """A broker that refuses anything sent to the requests topic outright (a retry over its limit)."""

    def __init__(self, topic: str) -> None:
        super().__init__()
        self.topic = topic

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        ack = await super().send_batch(batch, topic, partition=partition)
        if topic != self.topic:
            return ack
        refused: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        refused.set_exception(MessageSizeTooLargeError())
        return refused


async def test_a_retry_the_broker_refuses_ends_the_request_and_is_never_trained_again(settings: Settings) -> None:
    children = FakeChildren(fails("dataset_unavailable", retryable=True))
    core = CoreOnFakes(settings, RefusingRequestsTopic(settings.requests_topic), children)
    record = core.record(sft_request("r1"), 7)
    await core.intake.take(core.tp, [record])
    await core.scheduler.jobs[core.tp].task
    assert core.types("r1") == ["accepted", "started", "retrying", "failed"]
    assert core.events("r1")[-1]["code"] == "internal" and "refused its retry" in str(core.events("r1")[-1]["message"])
    assert [m.value for m in core.dead_letters()] == [record.value]  # its bytes kept
    assert core.consumer.commits == [(core.tp, 8)] and core.tp not in core.consumer.paused  # not read again
    assert len(children.taken) == 1
