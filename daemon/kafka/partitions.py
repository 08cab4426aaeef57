"""Partition ownership on the requests topic: pause and resume, commits, and rebalances.

An offset is committed only after the request's terminal event is acknowledged; commits are
retried while the brokers are away and given up once the partition has moved to another member
(which reads the request again). Commits of one partition happen in order: `settle_later` chains
them, so the intake path can settle a batch of rejections in the background.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence

import structlog
from aiokafka import ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import RecordMetadata
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from daemon.kafka.clients import Consumer
from daemon.kafka.records import Record

log = structlog.get_logger()


def _commit_retryable(exc: BaseException) -> bool:
    return isinstance(exc, KafkaError) and not isinstance(exc, CommitFailedError | IllegalStateError)


class Partitions:
    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self._settling: dict[TopicPartition, asyncio.Task[None]] = {}
        # Where the daemon should read each partition next, as far as it knows: past the last record
        # handed to intake, or where it last sought. What `rewind` goes back to (daemon/kafka/unreadable.py).
        self.expected: dict[TopicPartition, int] = {}
        self._learning: asyncio.Task[None] | None = None
        # What this member committed of each partition (the fleet's dispatcher reads it: a claims
        # partition whose last record is committed is idle, daemon/fleet/dispatcher.py).
        self.committed: dict[TopicPartition, int] = {}

    def assigned(self) -> set[TopicPartition]:
        return set(self.consumer.assignment())

    def highwater(self, tp: TopicPartition) -> int:
        """The partition's end offset as of the last fetch (0 when none is known)."""
        return self.consumer.highwater(tp) or 0

    def hold(self, tp: TopicPartition, next_offset: int) -> None:
        """Read nothing more of `tp` for now; when resumed, read it from `next_offset`."""
        self.consumer.seek(tp, next_offset)
        self.expected[tp] = next_offset
        self.consumer.pause(tp)

    def read_from(self, tp: TopicPartition, next_offset: int) -> None:
        """Read `tp` on from `next_offset` (undoes a `hold`)."""
        self.consumer.seek(tp, next_offset)
        self.expected[tp] = next_offset
        self.consumer.resume(tp)

    def handed(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        """Records of `tp` were read (and go to intake): the next read is past them."""
        if records:
            self.expected[tp] = records[-1].offset + 1

    def on_assigned(self, assigned: Collection[TopicPartition]) -> None:
        """A new assignment starts at the committed offsets: where each partition is read next,
        learnt in the background (the rebalance listener must not wait on offsets that the group
        coordinator fetches once it returns); a record handed or a seek made first wins."""
        self.expected = {}

        async def learn() -> None:
            for tp in assigned:
                try:
                    self.expected.setdefault(tp, await self.consumer.position(tp))
                except (KafkaError, IllegalStateError):
                    return  # moved away again: the next assignment learns its own

        self._learning = asyncio.create_task(learn())

    def rewind(self) -> None:
        """Every partition back to where the daemon should read next (records fetched but not handed
        on are read again)."""
        for tp, offset in self.expected.items():
            if tp in self.assigned():
                self.consumer.seek(tp, offset)

    def pause(self, partitions: Collection[TopicPartition]) -> None:
        self.consumer.pause(*partitions)

    def resume(self, partitions: Collection[TopicPartition]) -> None:
        self.consumer.resume(*partitions)

    async def commit(self, tp: TopicPartition, offset: int) -> None:
        """Commit, retrying while the brokers are away; not once the partition has moved."""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(_commit_retryable),
                wait=wait_exponential(multiplier=0.5, max=10),
                stop=stop_after_delay(300),
                reraise=True,
                before_sleep=lambda state: log.warning(
                    "offset.commit_retry", partition=tp.partition, offset=offset, attempt=state.attempt_number
                ),
            ):
                with attempt:
                    await self.consumer.commit({tp: offset})
            self.committed[tp] = max(offset, self.committed.get(tp, 0))
        except (CommitFailedError, IllegalStateError) as exc:
            # The partition moved to another member; that member reads the request again.
            log.warning("offset.commit_failed", partition=tp.partition, offset=offset, error=str(exc))

    def settle_later(self, tp: TopicPartition, acks: list[asyncio.Future[RecordMetadata]], last_offset: int) -> None:
        """Commit past `last_offset` once every ack has come and the partition's earlier settles are done."""
        previous = self._settling.get(tp)

        async def settle() -> None:
            if previous is not None:
                await previous
            try:
                await asyncio.gather(*acks)
            except Exception as exc:
                # Not committed: the messages are read again after a restart; nothing is lost.
                log.error("rejections.unacknowledged", partition=tp.partition, offset=last_offset, error=repr(exc))
                return
            await self.commit(tp, last_offset + 1)

        self._settling[tp] = asyncio.create_task(settle())

    async def settled(self, tp: TopicPartition | None = None) -> None:
        """Wait for the partition's background settles (every partition's when None)."""
        if tp is None:
            await asyncio.gather(*self._settling.values())
        elif tp in self._settling:
            await self._settling[tp]


class RebalanceListener(ConsumerRebalanceListener):
    """Tells the scheduler which partitions this member holds after each rebalance.

    aiokafka has no cooperative rebalancing: every rebalance revokes all partitions, and new
    assignments start unpaused at the committed offset, so the scheduler re-pauses what it runs.
    """

    def __init__(
        self,
        on_assigned: Callable[[set[TopicPartition]], Awaitable[None]],
        on_revoked: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.on_assigned = on_assigned
        self.on_revoked = on_revoked  # awaited before the member rejoins (the fleet's move in flight ends first)

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        log.info("partitions.revoked", partitions=sorted(tp.partition for tp in revoked))
        if self.on_revoked is not None:
            await self.on_revoked()

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("partitions.assigned", partitions=sorted(tp.partition for tp in assigned))
        await self.on_assigned(assigned)
