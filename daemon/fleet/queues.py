"""One class's queue topic as this host reads it: the group it joins while it wants the class's requests,
and a window of the first `WINDOW` waiting records of each partition it holds.

A window, not just the first record: a request that may not start yet (its team at its cap, a retry not
yet due, more GPUs than are free) must not hold up the requests behind it in its partition. A partition's
offset is one watermark, so a request taken from inside a window takes with it, in the same transaction,
the records before it: they are written again at the end of their own partition, with their own
timestamps (their arrival, so they keep their place in the fleet's order), headers and keys
(daemon/fleet/moves.py).

A record the Kafka client cannot read (a batch in a codec it cannot decompress, a header name not UTF-8)
is met by the same `CarefulReader` as the daemon's requests (daemon/kafka/unreadable.py): it takes its
place in the window by its offset, to be rejected there (dead-lettered, announced, committed past).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from daemon.fleet.choice import Head
from daemon.kafka.partitions import Partitions
from daemon.kafka.records import Record
from daemon.kafka.unreadable import CarefulReader, UnreadableRecord

log = structlog.get_logger()

WINDOW = 32  # the waiting records of one partition a host weighs at once


async def _nothing() -> None:
    return None


@dataclass
class ClassQueue:
    name: str
    topic: str
    group: str
    consumer: AIOKafkaConsumer
    # Awaited when the group takes this host's partitions back: the move in flight ends first (Mover.settled).
    settled: Callable[[], Awaitable[None]] = _nothing
    subscribed: bool = False
    joined: bool = False  # assigned its partitions since it subscribed (none, perhaps)
    generation: int = 0  # counts the rebalances: a record read in an earlier one is not moved (Move.still_ours)
    windows: dict[TopicPartition, list[Head]] = field(default_factory=dict)
    # The partitions polled since they joined after their first fetch's answer was in: what a poll returns of them
    # is all they held then (`known`).
    polled: set[TopicPartition] = field(default_factory=set)
    # Where each partition is read next, and the polling that steps past what the client cannot read.
    partitions: Partitions = field(init=False)
    reader: CarefulReader = field(init=False)

    def __post_init__(self) -> None:
        self.partitions = Partitions(self.consumer)
        self.reader = CarefulReader(self.consumer, self.partitions)

    def follow(self, want: bool) -> None:
        """Join the class's group while this host wants its requests; leave it otherwise (its partitions then go
        to the hosts that have room)."""
        if want and not self.subscribed:
            self.consumer.subscribe([self.topic], listener=QueueListener(self))
            self.subscribed, self.joined = True, False
            log.info("fleet.queue_joined", priority_class=self.name)
        elif not want and self.subscribed:
            self.consumer.unsubscribe()
            self.subscribed = self.joined = False
            self.generation += 1
            self.windows.clear()
            self.polled.clear()
            log.info("fleet.queue_left", priority_class=self.name)

    def known(self) -> bool:
        """Whether each of its partitions has been fetched once since it joined: only then does a turn see every
        request it holds (a turn right after a rebalance would miss a higher class's). A partition counts once a poll
        began after its first fetch's answer (its high watermark known): an answer taken in while the turn polled the
        other queues has records no window holds yet, and the turn would give their slot to a lower class."""
        return not self.subscribed or (
            self.joined and all(tp in self.windows or tp in self.polled for tp in self.consumer.assignment())
        )

    async def fetch(
        self,
        head: Callable[[ClassQueue, TopicPartition, Record], Awaitable[Head]],
        unreadable: Callable[[ClassQueue, TopicPartition, UnreadableRecord, BaseException], Head],
    ) -> None:
        """Fill each partition's window from what the consumer has fetched; a full window pauses its partition."""
        if not self.subscribed:
            return
        answered = {tp for tp in self.consumer.assignment() if self.consumer.highwater(tp) is not None}
        batches, met = await self.reader.poll(timeout_ms=0, max_records=WINDOW * 8)
        self.polled |= answered
        for unread, exc in met:  # one a partition at most, the next record of its partition: read one at a time
            tp = TopicPartition(unread.topic, unread.partition)
            self.windows.setdefault(tp, []).append(unreadable(self, tp, unread, exc))
        generation = self.generation
        for tp, records in batches.items():
            window = self.windows.setdefault(tp, [])
            for record in records:
                if len(window) >= WINDOW:
                    self.partitions.hold(tp, record.offset)  # read again once the window has room
                    break
                # Each record is decoded once, as it joins its window (a large one in a worker thread: the loop turns
                # meanwhile, and a rebalance may land).
                read = await head(self, tp, record)
                if self.generation != generation:
                    return  # the partitions were taken back meanwhile: read again from the group's offsets
                window.append(read)
            if len(window) >= WINDOW:
                self.consumer.pause(tp)

    def heads(self) -> list[Head]:
        return [head for window in self.windows.values() for head in window]

    def before(self, head: Head) -> list[Record]:
        """The records ahead of `head` in its window: written again behind it when it is taken."""
        return [h.record for h in self.ahead(head)]

    def ahead(self, head: Head) -> list[Head]:
        """The heads ahead of `head` in its window."""
        window = self.windows.get(head.tp, [])
        return window[: window.index(head)] if head in window else []

    def taken(self, head: Head) -> None:
        """`head` and the records before it are committed past: the window goes on after it."""
        window = self.windows.get(head.tp)
        if window is not None and head in window:
            del window[: window.index(head) + 1]
            self.consumer.resume(head.tp)


class QueueListener(ConsumerRebalanceListener):
    def __init__(self, queue: ClassQueue) -> None:
        self.queue = queue

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        self.queue.joined = False
        self.queue.generation += 1  # first: a move that has not yet begun is not made
        for tp in revoked:
            self.queue.windows.pop(tp, None)
            self.queue.polled.discard(tp)
        await self.queue.settled()  # a move that has begun commits before this member rejoins

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.queue.joined = True
        self.queue.partitions.on_assigned(assigned)
        log.info(
            "fleet.queue_assigned", priority_class=self.queue.name, partitions=sorted(tp.partition for tp in assigned)
        )
