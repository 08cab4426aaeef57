"""daemon/jobs/settle.py: `next_try`, the attempt and due time a `retrying` job's request is sent back
with; and `Settler.settle` on the in-memory fakes: the retry copy (to the class's queue with priority
classes), the dead letter after the last try, the commit. Through the scheduler: test_scheduler_core.py
and test_packing.py."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from daemon.job.plan import JobPlace
from daemon.job.runner import Arrival, JobRunner, JobServices
from daemon.jobs.settle import NextTry, Settler, next_try
from daemon.kafka.retry_state import MAX_BACKOFF_S
from daemon.settings import Settings
from schemas import Failed, Retrying
from tests.core import CoreOnFakes
from tests.fakes import FakeRecord
from tests.helpers import sft_request

NOW = 1_000_000.0


def test_a_retryable_failure_is_the_next_attempt_after_a_doubling_backoff() -> None:
    assert next_try("hub_unavailable", 1, False, 30.0, NOW) == NextTry(2, NOW + 30.0, alone=False)
    assert next_try("hub_unavailable", 2, False, 30.0, NOW) == NextTry(3, NOW + 60.0, alone=False)
    assert next_try("hub_unavailable", 3, True, 30.0, NOW) == NextTry(4, NOW + 120.0, alone=False)


def test_the_backoff_is_capped() -> None:
    assert next_try("stalled", 30, False, 30.0, NOW).due == NOW + MAX_BACKOFF_S


def test_out_of_memory_on_a_shared_gpu_is_the_same_attempt_now_alone() -> None:
    assert next_try("out_of_memory", 2, True, 30.0, NOW) == NextTry(2, NOW, alone=True)


def test_out_of_memory_on_a_gpu_of_its_own_is_its_own_failure() -> None:
    assert next_try("out_of_memory", 2, False, 30.0, NOW) == NextTry(3, NOW + 60.0, alone=False)


@pytest.fixture
def core(tmp_path: Path) -> CoreOnFakes:
    return CoreOnFakes(
        Settings(
            gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None, max_attempts=3, retry_backoff_s=30
        )
    )


def settler_and_runner(core: CoreOnFakes, offset: int) -> tuple[Settler, JobRunner, FakeRecord]:
    record = core.record(sft_request("r1"), offset)
    runner = JobRunner(
        Arrival(core.request(record), received_at=0.0),
        JobServices(core.settings, core.publisher, core.children),
        JobPlace("cpu"),
    )
    scheduler = core.scheduler
    return (
        Settler(core.settings.retry_backoff_s, core.publisher, core.partitions, scheduler.retries, scheduler.faults),
        runner,
        record,
    )


@pytest.mark.parametrize("queue", [None, "requests.urgent"])
async def test_a_retrying_job_goes_back_signed_for_its_next_attempt_then_is_committed(
    core: CoreOnFakes, queue: str | None
) -> None:
    settler, runner, record = settler_and_runner(core, 4)
    event = runner.events.event(Retrying, code="hub_unavailable", message="503", stage="push", max_attempts=3)
    before = time.time()
    assert await settler.settle(
        core.tp, record, runner, event, None if queue is None else lambda retry: dataclasses.replace(retry, topic=queue)
    )

    [again] = core.producer.on(queue or core.settings.requests_topic)
    assert again.value == record.value
    state = core.scheduler.retries.read(core.record(sft_request("r1"), 9, headers=again.headers))
    assert (
        state.attempt == 2 and not state.alone and state.due is not None and state.due >= before + 30 - 0.001
    )  # to the millisecond
    assert core.consumer.commits == [(core.tp, 5)] and core.dead_letters() == []


async def test_a_retryable_failure_on_the_last_try_is_dead_lettered_and_committed(core: CoreOnFakes) -> None:
    settler, runner, record = settler_and_runner(core, 4)
    event = runner.events.event(Failed, code="hub_unavailable", message="503", stage="push", retryable=True)
    assert await settler.settle(core.tp, record, runner, event, None)
    [letter] = core.dead_letters()
    assert letter.value == record.value and core.requeued() == []
    assert core.consumer.commits == [(core.tp, 5)]
