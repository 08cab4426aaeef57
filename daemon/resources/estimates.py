"""The memory estimates the scheduler's offer waits for, worked out beside the Kafka loop, never on
its path (issue 46: slow weight headers once held the loop 68 s, one record after another).

The offer asks `ready` on the loop, which never waits: an estimate from models read before comes at
once (`Estimator.known`); else a task reads the request's models (`Estimator.need`, every model at
once, all within one deadline) while the loop polls on, the record's partition held at the record
(paused; the record stays in Kafka), and `on_done` is told when it is ready: the scheduler resumes
the partition, the record is read again and offered with its estimate. The estimates of a batch's
partitions run at once, so a batch waits about one deadline in all, not one a record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog
from aiokafka import TopicPartition

from daemon.resources.memory import Estimate
from schemas import RequestBase

log = structlog.get_logger()


class Estimating(Protocol):
    """What `Estimates` asks of the estimator (daemon/resources/estimator.py; a fake in tests)."""

    def known(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> tuple[bool, Estimate | None]: ...

    async def need(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> Estimate | None: ...


@dataclass(frozen=True)
class Pending:
    """A partition's record whose estimate is being worked out."""

    offset: int
    request_id: str
    task: asyncio.Task[Estimate | None]


class Estimates:
    """One estimate in progress a partition (a partition waits at its first request without one)."""

    def __init__(self, on_done: Callable[[TopicPartition], None]) -> None:
        self.on_done = on_done  # a partition's estimate is ready: its record can be offered again
        self.pending: dict[TopicPartition, Pending] = {}

    def ready(
        self, estimator: Estimating, tp: TopicPartition, offset: int, request: RequestBase
    ) -> tuple[bool, Estimate | None]:
        """(True, its estimate, None when unknown) when the record's estimate is ready; (False, None)
        while it is worked out, started now if it was not."""
        pending = self.pending.get(tp)
        if pending is not None and (pending.offset, pending.request_id) == (offset, request.request_id):
            if not pending.task.done():
                return False, None
            del self.pending[tp]
            failed = pending.task.exception() if not pending.task.cancelled() else asyncio.CancelledError()
            if failed is not None:  # `need` says unknown rather than raise: a bug, and the job takes a whole GPU
                log.error(
                    "memory.estimate_failed",
                    request_id=request.request_id,
                    error=f"{type(failed).__name__}: {failed}"[:300],
                )
                return True, None
            return True, pending.task.result()
        self.forget(tp)
        known, found = estimator.known(request)
        if known:
            return True, found
        task = asyncio.create_task(estimator.need(request), name=f"estimate-{request.request_id}")
        started = self.pending[tp] = Pending(offset, request.request_id, task)
        log.info("memory.estimating", request_id=request.request_id, partition=tp.partition, offset=offset)
        since = time.monotonic()

        def done(_: asyncio.Task[Estimate | None]) -> None:
            if self.pending.get(tp) is started:  # not forgotten meanwhile
                known = not task.cancelled() and task.exception() is None and task.result() is not None
                log.info(
                    "memory.estimated",
                    request_id=request.request_id,
                    partition=tp.partition,
                    known=known,
                    seconds=round(time.monotonic() - since, 3),
                )
                self.on_done(tp)

        task.add_done_callback(done)
        return False, None

    def running(self, tp: TopicPartition) -> bool:
        """Whether `tp` waits at a record for its estimate."""
        pending = self.pending.get(tp)
        return pending is not None and not pending.task.done()

    def forget(self, tp: TopicPartition) -> None:
        """`tp`'s estimate is no longer wanted (its record was let go, or read past)."""
        pending = self.pending.pop(tp, None)
        if pending is not None:
            pending.task.cancel()

    def forget_all(self) -> None:
        """After a rebalance (every partition starts again, unpaused, at its committed offset: the
        records are read and offered again, and their estimates asked again; reads of models in
        flight go on, `Estimator` shares them), and when the daemon stops."""
        for tp in list(self.pending):
            self.forget(tp)
