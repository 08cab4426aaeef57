"""A record whose handling keeps failing outside its job (here: the broker refuses its `accepted`
event as too large) is read again a few times, then ends as `failed` (code internal) with its
bytes in the DLQ and its offset committed, never offered for ever. In process: the scheduler with
stand-ins for the consumer's partitions and the broker's side of the publisher, no Kafka, no child."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.structs import ConsumerRecord

from daemon.job.plan import JobPlace
from daemon.job.runner import Arrival, JobRunner, JobServices
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.publisher import Outgoing, Publisher
from daemon.resources.slots import Slots
from daemon.settings import Settings
from schemas import Accepted, Failed, decode_request
from schemas.events import EventBase
from tests.fakes import FakeProducer
from tests.helpers import sft_request

TP = TopicPartition("requests", 0)


class Partitions:
    """The consumer's side: what is held, what is committed."""

    def __init__(self) -> None:
        self.held: list[int] = []
        self.committed: list[int] = []

    def assigned(self) -> set[TopicPartition]:
        return {TP}

    def hold(self, tp: TopicPartition, offset: int) -> None:
        self.held.append(offset)

    def pause(self, partitions: Any) -> None:
        pass

    def resume(self, partitions: Any) -> None:
        pass

    async def commit(self, tp: TopicPartition, offset: int) -> None:
        self.committed.append(offset)


class Broker(Publisher):
    """The real publisher's messages, sent to a list; `accepted` events are refused as too large."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, FakeProducer())  # never used (deliver and publish are this list's), never opened
        self.sent: list[Outgoing | EventBase] = []

    async def deliver(self, message: Outgoing) -> None:
        self.sent.append(message)

    async def publish(self, event: EventBase, trace: list[tuple[str, bytes]] | None = None) -> None:
        if isinstance(event, Accepted):
            raise MessageSizeTooLargeError()
        self.sent.append(event)


class Children:
    async def prepare(self, wanted: list[str | None]) -> None:
        pass


async def test_a_record_that_keeps_failing_outside_its_job_ends_failed_in_the_dlq(tmp_path: Path) -> None:
    settings = Settings(work_dir=tmp_path, gpus=[], warm_child=False, max_record_faults=3)
    broker, partitions = Broker(settings), Partitions()
    scheduler = Scheduler(settings, broker, partitions, Slots([], 1), Children(), on_change=lambda: None)  # type: ignore[arg-type]
    raw = json.dumps(sft_request("too-large")).encode()
    record = ConsumerRecord("requests", 0, 41, 0, 0, b"too-large", raw, None, 9, len(raw), [])
    request = decode_request(raw, record.key)
    for attempt in range(1, 4):
        runner = JobRunner(Arrival(request, 0.0), JobServices(settings, broker, Children()), JobPlace("cpu"))  # type: ignore[arg-type]
        await scheduler._run(TP, record, runner)
        if attempt < 3:  # read again from the same record, nothing sent, nothing committed
            assert partitions.held[-1] == 41 and partitions.committed == [] and broker.sent == []
    [letter, failed] = broker.sent
    assert isinstance(letter, Outgoing) and letter.topic == settings.dlq_topic and letter.value == raw
    headers = dict(letter.headers)
    assert headers["adapterd-reason"] == b"internal" and headers["adapterd-exception"] == b"MessageSizeTooLargeError"
    assert isinstance(failed, Failed) and failed.code == "internal" and not failed.retryable
    assert partitions.committed == [42] and scheduler.faults.counts == {}
