"""Read every partition of one topic without a consumer group: the one reader behind the control
topic (every daemon reads every cancel), the events topic (the CLI, the demo) and the tests.

It reads every partition of the topic, or the few named (`partitions`: one request's key's partition, for
`adapterd get`). It starts at the beginning of each partition, at its end as of `start()`, at its first record at or
after a time (`since`), or at given offsets (a group's committed offsets: `adapterd jobs --state queued`; the
fleet's view, past the table's keepers', and at `since` where they committed none), and knows when it has caught up
with the ends it saw at `start()`, so a reader can stop there or go on following. Caught up is judged by the
consumer's position, not by the last record's offset: a topic written in transactions (the fleet's
claims and queue topics) ends in a commit marker, which is an offset but never a record.

A record the Kafka client cannot unpack (a header name that is not UTF-8, a batch in a codec it cannot
decompress; daemon/kafka/unreadable.py says how it breaks aiokafka) is stepped past by the same
`CarefulReader` as the daemon's, logged and counted, rather than ending the reader: the control
topic's reader would otherwise stop taking cancels for good. Nothing is dead-lettered: every daemon
and every CLI command reads these topics, so each would send a copy.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping
from types import TracebackType

from aiokafka import AIOKafkaConsumer, TopicPartition

from daemon.kafka.admin.topics import partition_numbers
from daemon.kafka.options import kafka_options
from daemon.kafka.partitions import Partitions
from daemon.kafka.records import Record
from daemon.kafka.unreadable import CarefulReader
from daemon.settings import Settings

# The most records of one poll: the Kafka client unpacks a poll's records on the loop (a poll of 10,000 of the table's
# entries held a daemon's loop 0.5 s; 1,000 events are ~0.5 MB, 1,000 entries ~3 MB).
MAX_RECORDS = 1_000


class TopicReader:
    """`async with TopicReader(settings, topic) as reader: async for record in reader.records(): ...`"""

    def __init__(
        self,
        settings: Settings,
        topic: str,
        *,
        from_end: bool = False,
        client_id: str | None = None,
        since: float | None = None,
        start_at: Mapping[int, int] | None = None,
        read_committed: bool = False,
        partitions: Collection[int] | None = None,
    ) -> None:
        self.settings = settings
        self.topic = topic
        self.from_end = from_end
        self.since = since  # epoch seconds: read from the first record at or after it (the end when there is none)
        # Partition → the offset to begin at, or with `since` too, at the later of it and the time's (a partition left
        # out: its first record, or `since`'s where that is given too); never before the log's start.
        self.start_at = start_at
        self.only = None if partitions is None else frozenset(partitions)  # None: every partition of the topic
        self.consumer = AIOKafkaConsumer(
            **kafka_options(settings),
            group_id=None,
            enable_auto_commit=False,
            isolation_level="read_committed" if read_committed else "read_uncommitted",
            **({"client_id": client_id} if client_id else {}),
        )
        self.ends: dict[TopicPartition, int] = {}
        self.partitions = Partitions(self.consumer)
        self.careful = CarefulReader(self.consumer, self.partitions)
        # Past the last record yielded, per partition: where a step past an unreadable record rewinds to.
        self.next_offset: dict[TopicPartition, int] = self.partitions.expected
        # Set once every record that existed at `start()` has been yielded (at once when reading from the end).
        self.caught_up = asyncio.Event()

    async def start(self) -> TopicReader:
        """Assign every partition of the topic (or those asked for that it has) and place the reader; a LookupError if
        the topic is missing."""
        try:
            numbers = await partition_numbers(self.settings, self.topic)
            await self.consumer.start()
        except BaseException:
            await (
                self.consumer.stop()
            )  # a broker that does not answer leaves no open client behind ("Unclosed AIOKafkaConsumer")
            raise
        partitions = [
            TopicPartition(self.topic, number) for number in sorted(numbers) if self.only is None or number in self.only
        ]
        self.consumer.assign(partitions)
        await self._place(partitions)
        return self

    async def again(self, start_at: Mapping[int, int]) -> None:
        """Placed again at `start_at`, as `start` places a reader given it, to read up to the ends as of now: a reader
        kept open between reads (the announcer's, daemon/kafka/admin/group_offsets.py) makes no new client each time."""
        self.start_at, self.since, self.from_end = start_at, None, False
        await self._place(list(self.ends))

    def rest(self) -> None:
        """Fetch nothing until placed again (`again`): the consumer would otherwise go on fetching, in the background,
        what no one reads."""
        self.consumer.pause(*self.ends)

    async def _place(self, partitions: list[TopicPartition]) -> None:
        self.ends = await self.consumer.end_offsets(partitions)
        self.caught_up.clear()
        start = {tp: self.ends[tp] if self.from_end else 0 for tp in partitions}
        if self.since is not None and not self.from_end:
            found = await self.consumer.offsets_for_times({tp: max(0, int(self.since * 1000)) for tp in partitions})
            start = {tp: found[tp].offset if found.get(tp) is not None else self.ends[tp] for tp in partitions}
        since_at = dict(start) if self.since is not None else {}
        if self.start_at is not None:
            first = await self.consumer.beginning_offsets(partitions)
            # A partition `start_at` leaves out begins at its first record, or with `since` too at that time's; with
            # both, a partition begins at the later of its offset and its time's.
            start = {
                tp: min(self.ends[tp], max(first[tp], self.start_at[tp.partition], since_at.get(tp, 0)))
                if tp.partition in self.start_at
                else (start[tp] if self.since is not None else first[tp])
                for tp in partitions
            }
        for tp in partitions:
            self.partitions.read_from(tp, start[tp])

    async def stop(self) -> None:
        await self.consumer.stop()

    async def __aenter__(self) -> TopicReader:
        return await self.start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def records(self, *, follow: bool = True) -> AsyncIterator[Record]:
        """The records in partition order. Without `follow`, stop once caught up with the ends as of `start()`."""
        async for batch in self.batches(follow=follow):
            for record in batch:
                yield record

    async def batches(self, *, follow: bool = True) -> AsyncIterator[list[Record]]:
        """The records as each poll brings them, a partition's list at a time (a reader that verifies them in worker
        threads sends a batch, not each record); otherwise as `records`."""
        behind = {tp for tp, end in self.ends.items() if end > self.next_offset.get(tp, 0)}
        while True:
            if not behind and not self.caught_up.is_set():
                self.caught_up.set()
            if not behind and not follow:
                return
            # A record none can read is stepped past inside the poll, logged and counted there (and dropped here).
            polled, _ = await self.careful.poll(timeout_ms=1000, max_records=MAX_RECORDS)
            for tp, records in polled.items():
                if not records:
                    continue
                self.next_offset[tp] = records[-1].offset + 1
                yield list(records)
                if records[-1].offset + 1 >= self.ends.get(tp, 0):
                    behind.discard(tp)
            for tp in list(behind):
                if await self.consumer.position(tp) >= self.ends[tp]:
                    behind.discard(tp)  # past a marker or an aborted batch: no record to yield, yet caught up
