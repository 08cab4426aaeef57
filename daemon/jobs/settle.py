"""What a job's published end does to its request's record, in Kafka: committed after a terminal
event; after `retrying`, sent back to the end of its partition (or, with priority classes, of its
class's queue) with its next attempt and the time it is due in signed headers, then committed; after
a retryable `failed` on the last try, dead-lettered too. `next_try` decides the attempt and the delay.

A retry the broker refuses outright is not tried again: the job ends there (daemon/jobs/faults.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiokafka import TopicPartition
from aiokafka.errors import KafkaError

from daemon.job.runner import JobRunner
from daemon.jobs.faults import RecordFaults
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Outgoing, Publisher
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner, backoff_s
from schemas import Failed, Retrying
from schemas.events import EventBase

log = structlog.get_logger()


@dataclass(frozen=True)
class NextTry:
    attempt: int
    due: float  # time.time() at which it may run
    alone: bool  # on a GPU of its own (daemon/resources/slots.py), whatever its estimate


def next_try(code: str, attempt: int, shared: bool, base_backoff_s: float, now: float) -> NextTry:
    """The try after a `retrying` one of `attempt`: the next attempt after its backoff; but out of memory
    on a GPU shared with other jobs is not the job's failure: the same attempt, due now, alone."""
    if code == "out_of_memory" and shared:
        return NextTry(attempt, now, alone=True)
    return NextTry(attempt + 1, now + backoff_s(base_backoff_s, attempt + 1), alone=False)


class Settler:
    """Ends a job's record after its published event (`settle`); the faults of that path are the caller's."""

    def __init__(
        self,
        base_backoff_s: float,
        publisher: Publisher,
        partitions: Partitions,
        retries: RetrySigner,
        faults: RecordFaults,
    ) -> None:
        self.base_backoff_s = base_backoff_s
        self.publisher = publisher
        self.partitions = partitions
        self.retries = retries
        self.faults = faults

    async def settle(
        self,
        tp: TopicPartition,
        record: Record,
        runner: JobRunner,
        event: EventBase,
        requeue: Callable[[Outgoing], Outgoing] | None,
    ) -> bool:
        """After `event` (terminal or `retrying`): its record's retry or dead letter, then its commit.
        `requeue`, with priority classes: the retry sent to the queue of the class the request runs as, where it waits.
        False when the broker refused its retry: the record is ended by `RecordFaults.end`
        (or held, to be read again)."""
        offset = record.offset
        if isinstance(event, Retrying):
            # Back to the end of its partition, so the requests behind it are not held up.
            again = next_try(
                event.code, runner.attempt, runner.place.share is not None, self.base_backoff_s, time.time()
            )
            retry = self.publisher.retry_copy(
                record,
                self.retries.headers(record.key, record.value or b"", again.attempt, again.due, alone=again.alone),
            )
            if requeue is not None:  # back to its class's queue, where any host with room takes it when it is due
                retry = requeue(retry)
            try:
                await self.publisher.deliver(retry)
            except KafkaError as exc:  # refused outright (deliver waits out what passes): ended, never trained again
                log.error(
                    "job.retry_refused", request_id=runner.request.request_id, offset=offset, error=type(exc).__name__
                )
                message = (
                    f"the broker refused its retry ({type(exc).__name__}); it is not "
                    "tried again (see max_message_bytes)"
                )
                if not await self.faults.end(tp, record, runner, exc, message):
                    self.partitions.hold(tp, offset)  # not even that could be sent: read again, as after a restart
                return False
        elif isinstance(event, Failed) and event.retryable:
            log.warning("job.attempts_exhausted", request_id=runner.request.request_id, attempts=runner.attempt)
            await self.publisher.deliver(self.publisher.failed_letter(record, event))
        await self.partitions.commit(tp, offset + 1)
        return True
