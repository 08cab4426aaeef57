"""Moving a request from one topic to another in one Kafka transaction: the copy is written and the
offset it was read at is committed together, or neither is.

This is what makes the fleet's queue safe under SIGKILL and broker restarts: a request taken from a
class's queue into a host's claims partition (daemon/fleet/dispatcher.py), or sent back to its queue
when it is preempted (daemon/fleet/claimed.py), is never in both places, nor in neither. The
transaction is the house's `Transactions` seam (daemon/kafka/clients.py: aiokafka's transactional producer,
whose id is this host's, so a daemon restarted on the host fences the old one's unfinished transaction; an
in-memory one in the tests); the claims topic is read `read_committed`, so an aborted copy is never run.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import structlog
from aiokafka import TopicPartition

from daemon.kafka.clients import Transactions, Write
from daemon.kafka.copies import producer_signature
from daemon.kafka.queue_seal import QueueSeal
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.kafka.trace import trace_context
from daemon.settings import Settings
from schemas.common import AdapterdError

log = structlog.get_logger()


@dataclass(frozen=True)
class Copy:
    """A record to write: its key and value as they were, with `headers` (the caller's: never a producer's
    own headers, whose size it chose), to `topic` (partition `partition`, else by its key), signed by the
    fleet with its class, team and arrival (daemon/kafka/queue_seal.py): only a host's
    copy is run or keeps its place."""

    record: Record
    topic: str
    priority_class: str  # the class of `topic`, or, in the claims topic, the class the request runs as
    team: str
    arrival_ms: int  # when the request arrived (daemon/fleet/choice.py `Arrivals`); also the record's timestamp
    headers: tuple[tuple[str, bytes], ...] = ()
    partition: int | None = None


@dataclass(frozen=True)
class Move:
    """Write `copies` and commit `group`'s offset of `record`'s partition past `record`, together. A request
    taken from a queue is one copy, plus the records before it in its window (written again at the end of
    their own partition, with their own timestamps: daemon/fleet/queues.py); one rejected there is none."""

    record: Record
    group: str
    copies: tuple[Copy, ...] = ()
    # Whether the record's partition is still this member's, as when it was read: checked once the move holds
    # the lock. aiokafka's transactional offset commit carries no group generation (Kafka's own fencing of a
    # member that lost its partition, KIP-447), so this host fences itself: see `Mover.settled`.
    still_ours: Callable[[], bool] = lambda: True


class Stale(AdapterdError):
    """A move not made: the record's partition went to another member since it was read (it reads it again)."""


class Mover:
    """Moves over the host's `Transactions` (daemon/kafka/clients.py); one at a time (a producer has one open
    transaction), each copy signed by the fleet."""

    def __init__(self, settings: Settings, transactions: Transactions) -> None:
        self.transactions = transactions
        self.seal = QueueSeal.from_settings(settings)  # signs every copy a move writes
        # One move at a time; a rebalance of a group whose offsets a move commits waits for the move in flight
        # (`settled`), and a move whose read is older than the rebalance is not made (`Move.still_ours`).
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        if self.seal.signer is None:  # the daemon's start-up refuses classes without keys; what a host does if it ran
            log.warning("fleet.queue_unsigned", claims_verified=self.seal.verifies, claiming=self.seal.writes_trusted)
        await self.transactions.start()

    async def settled(self) -> None:
        """Wait for a move in flight. A rebalance listener awaits it before its member gives its partitions up
        (aiokafka awaits the listener before the member rejoins), so a move made with the old assignment has
        committed before another member can read the partition, and none is made after (`Move.still_ours`)."""
        async with self.lock:
            pass

    async def stop(self) -> None:
        await self.transactions.stop()

    async def move(self, move: Move) -> int | None:
        """Do `move`; the offset of its last copy (None without one). Raises (the transaction aborted, nothing
        moved) when the broker refuses it: the record stays where it was and is read again."""
        record = move.record
        async with self.lock:
            if not move.still_ours():
                raise Stale(f"{record.topic}[{record.partition}] moved to another member since its record was read")
            offset = await self.transactions.commit_with(
                [self._written(copy) for copy in move.copies],
                move.group,
                TopicPartition(record.topic, record.partition),
                record.offset + 1,
            )
        if offset is not None:
            log.debug(
                "fleet.moved",
                from_topic=record.topic,
                partition=record.partition,
                offset=record.offset,
                to_topic=move.copies[-1].topic,
                to_partition=move.copies[-1].partition,
                to_offset=offset,
            )
        return offset

    def _written(self, copy: Copy) -> Write:
        """`copy` as its transaction writes it: its record's key, value and arrival, signed by the fleet."""
        return Write(
            copy.topic,
            copy.partition,
            copy.record.key,
            copy.record.value or b"",
            kept_timestamp(copy.arrival_ms),
            self._signed(copy),
        )

    def _signed(self, copy: Copy) -> list[tuple[str, bytes]]:
        return [
            *copy.headers,
            *self.seal.headers(
                copy.topic,
                copy.partition,
                copy.record.key,
                copy.record.value or b"",
                copy.priority_class,
                copy.team,
                copy.arrival_ms,
            ),
        ]


def kept_timestamp(timestamp: int) -> int | None:
    """A record's own timestamp, written again as it was; a producer's impossible one (Kafka takes any 64-bit
    number) becomes the time of the move rather than a send the client refuses, which would stop the queue."""
    return timestamp if 0 <= timestamp < 2**53 else None


def carried(record: Record, retries: RetrySigner, *, preemptions: int | None = None) -> tuple[tuple[str, bytes], ...]:
    """The headers a moved request keeps: its retry state and count of preemptions, signed again (a producer's
    unsigned ones are dropped, as `RetrySigner.read` would ignore them), its producer's signature, and its trace
    context; nothing else of a producer's, whose headers could make the copy larger than the brokers take.
    `preemptions` replaces the count."""
    value = record.value or b""
    state = retries.read(record)
    kept = (
        list(retries.headers(record.key, value, state.attempt, state.due, alone=state.alone))
        if state.due is not None
        else []
    )
    count = retries.preemptions(record) if preemptions is None else preemptions
    if count:
        kept += retries.preemption_headers(record.key, value, count)
    return (*kept, *producer_signature(record), *trace_context(record))
