"""The table's keeper: the state topic kept as the fold of the events topic, as Kafka Streams keeps a KTable.

Every daemon runs one. The keepers are one consumer group on the events topic (`keeper_group`), so each events
partition has one keeper at a time, and the entries of its requests are written by that keeper alone, to the state
partition of the same number (the state topic has the events topic's partitions). For each events partition it is
assigned, a keeper:

1. restores that partition's entries from the state partition, from its beginning to its end (`Restoring`: per key
   the entry with the highest place in the events topic; a record refused is counted and never taken; where a key's
   latest record is not the entry kept, the entry is written again, so the compacted topic converges back);
2. reads the events from the group's committed offset (none: the partition's beginning; a state partition found
   empty: from the beginning too, so a table lost is rebuilt), verifies them with the fleet's keys, folds each into
   its request's entry (`folded`: an event at or before an entry's place is skipped, so reading again after any
   crash is harmless), writes each changed entry, signed, once per poll, and commits the events offsets once the
   brokers acknowledged the entries. So the table is complete up to the group's committed offsets, which is where
   the readers (`adapterd jobs`, `get`, the fleet's view) start folding the tail;
3. on revocation, finishes the batch in hand (written, committed) and forgets the partition's entries (every
   rebalance revokes all: aiokafka's are eager, so an assignment is restored again, as Kafka Streams does
   without local state);
4. writes a tombstone for each entry ended longer than `state_retention_s` ago (at restore, every SWEEP_INTERVAL_S,
   and instead of an entry already that old), and forgets it;
5. every SWEEP_INTERVAL_S, reads its state partitions again beside the loop (an audit): where a key's latest record
   is not what it holds (a record another wrote while it keeps the partition: forged, replayed), it writes its own
   again, so that compaction never leaves the other alone;
6. at most every SEAL_INTERVAL_S, once it wrote anything to a partition since, writes the partition's seal
   (daemon/table/codec.py `Seal`: the digest of each entry's value as written, under one signature), so a reader of
   the whole table verifies a few seals and the entries written since, not every entry.

Verifying, parsing, folding and signing run in the `table` worker threads, a batch of CHUNK records at a time, the
loop turning between batches. Memory holds the entries of the keeper's partitions (each bounded: `TableEntry`).
The brokers away, or anything else that fails, is logged and retried from a fresh start (a restore), never raised
into the daemon. A state topic missing or with fewer partitions than the events topic keeps no table (logged once;
`adapterd doctor` says it and how to fix it), looked at again every CHECK_INTERVAL_S.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from typing import Protocol

import structlog
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition

from daemon import executors
from daemon.kafka.admin.topics import partition_counts
from daemon.kafka.clients import Consumer
from daemon.kafka.options import kafka_options
from daemon.kafka.partitions import Partitions
from daemon.kafka.records import Record
from daemon.kafka.unreadable import CarefulReader
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys, event_signer
from daemon.table.codec import MAX_ENTRY_BYTES
from daemon.table.kept import KeptPartition, Restoring, Write, Written
from daemon.table.topic import keeper_group

log = structlog.get_logger()

# The most events of one poll: one round of writes and commits, each changed entry written once in it. A keeper
# catching up with a history writes an entry at each round its request changed in: rounds of 2,000 wrote 210,000
# records for 22,605 requests on benchmarks.fleet_scale's history, a state topic of 147 MB a partition until compacted.
MAX_RECORDS = 10_000
CHUNK = 2_000  # the records a worker thread takes at once; the loop turns meanwhile
# The entries of one poll of a restore or an audit: the Kafka client unpacks them on the loop (10,000 entries held it
# 0.66 s).
RESTORE_RECORDS = 1_000
POLL_MS = 500  # a stop is noticed within this
SWEEP_INTERVAL_S = 600.0  # how often the entries ended past their retention are tombstoned
# How often a partition written to is sealed at most: a reader verifies each entry written since its seal (a fleet of
# 256 GPUs changes ~100 entries a minute), and each seal is a few hundred KB written.
SEAL_INTERVAL_S = 60.0
CHECK_INTERVAL_S = 60.0  # how often a missing or short state topic is looked at again
RETRY_MAX_S = 60.0  # the longest wait before starting again after a failure (doubling from 1 s)
# The longest a fleet host's keeper waits for its fleet's view to be whole before it restores its partitions anyway
# (`Keeper.view_whole`): a view that cannot load (a fault of its own) never keeps the table from being kept.
VIEW_WAIT_S = 60.0


class TableKafka(Protocol):
    """What the keeper asks of Kafka: aiokafka's in `KafkaTable`; testbed/memory_kafka.py's `NoTable` for the
    daemon's core on fakes (it says there are no topics: no table is kept)."""

    async def partition_counts(self) -> tuple[int, int]:
        """The events topic's partitions and the state topic's (0: missing)."""

    def group(self) -> Consumer:
        """A new consumer of the events topic in the keepers' group, not started, not subscribed."""

    def state(self, partition: int) -> AsyncIterator[Sequence[Record]]:
        """State partition `partition`'s records from its beginning to its end as of the call, batch by batch."""

    async def start(self) -> None: ...
    async def stop(self) -> None: ...

    async def write(self, partition: int, writes: Sequence[Write]) -> None:
        """Write to state partition `partition`; return once the brokers acknowledged every record, else raise."""


class KafkaTable:
    """`TableKafka` over aiokafka: made at `start`, so wiring it makes no client."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.producer: AIOKafkaProducer | None = None

    async def partition_counts(self) -> tuple[int, int]:
        topics = [self.settings.events_topic, self.settings.state_topic]
        found = await partition_counts(self.settings, topics)
        return found.get(topics[0], 0), found.get(topics[1], 0)

    def group(self) -> Consumer:
        consumer: Consumer = AIOKafkaConsumer(
            **kafka_options(self.settings),
            group_id=keeper_group(self.settings.group_id),
            client_id=f"adapterd-{self.settings.host}-table",
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # nothing committed: the partition's first event
            isolation_level="read_committed",  # an event of an aborted transaction never happened
            max_poll_interval_ms=self.settings.max_poll_interval_ms,
            session_timeout_ms=self.settings.session_timeout_ms,
            group_instance_id=self.settings.group_instance_id,  # a restart within the session moves nothing
        )
        return consumer

    async def state(self, partition: int) -> AsyncIterator[Sequence[Record]]:
        consumer = AIOKafkaConsumer(
            **kafka_options(self.settings),
            group_id=None,
            enable_auto_commit=False,
            client_id=f"adapterd-{self.settings.host}-table-restore",
        )
        try:
            await consumer.start()
            tp = TopicPartition(self.settings.state_topic, partition)
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            first = (await consumer.beginning_offsets([tp]))[tp]
            partitions = Partitions(consumer)
            careful = CarefulReader(consumer, partitions)  # a record none can unpack is stepped past, logged
            partitions.read_from(tp, first)
            while await consumer.position(tp) < end:
                batches, _ = await careful.poll(timeout_ms=1000, max_records=RESTORE_RECORDS)
                records = [record for record in batches.get(tp, ()) if record.offset < end]
                if records:
                    yield records
        finally:
            await consumer.stop()

    async def start(self) -> None:
        self.producer = AIOKafkaProducer(
            **kafka_options(self.settings),
            client_id=f"adapterd-{self.settings.host}-table",
            acks="all",
            enable_idempotence=True,
            linger_ms=20,  # a poll's entries go in few requests
            max_batch_size=1 << 20,
            max_request_size=MAX_ENTRY_BYTES,  # an entry written is smaller (daemon/table/kept.py WRITTEN_MAX)
        )
        try:
            await self.producer.start()
        except BaseException:
            await self.producer.stop()  # a broker that does not answer leaves no open client behind
            raise

    async def stop(self) -> None:
        if self.producer is not None:
            await self.producer.stop()
            self.producer = None

    async def write(self, partition: int, writes: Sequence[Write]) -> None:
        assert self.producer is not None, "write before start"
        acks = [
            await self.producer.send(
                self.settings.state_topic, value=write.value, key=write.key, partition=partition, headers=write.headers
            )
            for write in writes
        ]
        await asyncio.gather(*acks)


class Keeper:
    """`run()` keeps the table until `stop()` (see the module's docstring); `clock` is the retention's."""

    def __init__(
        self,
        settings: Settings,
        kafka: TableKafka,
        clock: Callable[[], float] = time.time,
        sweep_every_s: float = SWEEP_INTERVAL_S,
        seal_every_s: float = SEAL_INTERVAL_S,
        view_whole: asyncio.Event | None = None,
        view_wait_s: float = VIEW_WAIT_S,
    ) -> None:
        self.settings = settings
        # A fleet host's view of the fleet, whole (daemon/fleet/view.py `caught_up`): its keeper joins the keepers'
        # group once it is, or after `view_wait_s`. Both read and verify the table on the same cores at a start, and
        # the view is what the host decides with: the two at once held the event loop 100 to 360 ms
        # (benchmarks.fleet_scale), one after the other under 100. The table is the later by seconds, which no reader
        # misses: each folds the events past the keepers' committed offsets.
        self.view_whole = view_whole
        self.view_wait_s = view_wait_s
        self.kafka = kafka
        self.clock = clock
        self.sweep_every_s = sweep_every_s
        self.seal_every_s = seal_every_s
        self.keys = event_keys(settings)  # None: events and entries are read unverified, as EventStream reads them
        self.signer = event_signer(settings)
        self.kept: dict[int, KeptPartition] = {}  # events partition → its entries, once restored
        self.restoring: dict[int, asyncio.Task[None]] = {}
        self.stopping = asyncio.Event()
        self.turn = asyncio.Lock()  # a poll's fold, writes and commits: a revocation waits for the one in hand
        # The partitions are restored one at a time: one table thread parses and verifies beside the loop, and the loop
        # unpacks one partition's records at a time.
        self.restore_turn = asyncio.Lock()
        self.said: set[str] = set()  # what is logged once: a reason of refusal, a topic's finding
        self.last_sweep = 0.0
        self.sealed_at: dict[int, float] = {}  # events partition → when its keeper last sealed it
        self.auditing: asyncio.Task[None] | None = None
        self.consumer: Consumer | None = None
        self.partitions: Partitions | None = None

    def stop(self) -> None:
        """End `run` at its next turn: the batch in hand is written and committed first."""
        self.stopping.set()

    async def run(self) -> None:
        """Keep the table until `stop()`; never raises (a failure is logged, and kept again from a fresh start)."""
        await self._wait_for_view()
        delay = 1.0
        while not self.stopping.is_set():
            try:
                kept = await self._keep()
            except Exception as exc:
                log.error(
                    "table.keeper_failed",
                    error=type(exc).__name__,
                    detail=str(exc)[:300],
                    retry_in_s=delay,
                    topic=self.settings.state_topic,
                )
                await self._pause(delay)
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            delay = 1.0
            if not kept:
                await self._pause(CHECK_INTERVAL_S)

    async def _pause(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), seconds)

    async def _wait_for_view(self) -> None:
        """Until the fleet's view is whole, the stop, or `view_wait_s` (said: the view is late)."""
        if self.view_whole is None or self.view_whole.is_set():
            return
        waits = [asyncio.ensure_future(self.view_whole.wait()), asyncio.ensure_future(self.stopping.wait())]
        try:
            done, _ = await asyncio.wait(waits, timeout=self.view_wait_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if not done:
            log.warning("table.view_late", waited_s=self.view_wait_s, note="the table is kept without waiting for it")

    async def _keep(self) -> bool:
        """Keep the table until the stop (True), or find that none can be kept (False)."""
        if self.keys is not None and self.signer is None:
            # Its entries would be unsigned, and every reader that verifies (this host's included) refuses them: it
            # stays out of the keepers' group, and the hosts that sign keep the table.
            self._once(
                "cannot-sign",
                "table.cannot_sign",
                reason="events are verified here but this host signs none: no table kept by this host",
                fix="event_signing_key_file",
            )
            return False
        events, state = await self.kafka.partition_counts()
        if not events:
            self._once(
                "no-events-topic",
                "table.no_events_topic",
                warning=True,
                events_topic=self.settings.events_topic,
                reason="no events to keep a table of yet",
            )
            return False
        if state < events:
            self._once(
                f"short-{state}-{events}",
                "table.state_topic_short",
                state_topic=self.settings.state_topic,
                state_partitions=state,
                events_topic=self.settings.events_topic,
                events_partitions=events,
                reason="no table kept: the state topic needs the events topic's partitions, compacted",
                fix="adapterd topics (a missing topic), adapterd topics --grow (too few partitions)",
            )
            return False
        await self.kafka.start()
        try:
            consumer = self.kafka.group()
            self.partitions = Partitions(consumer)
            reader = CarefulReader(consumer, self.partitions)  # an event none can unpack is stepped past, logged
            consumer.subscribe([self.settings.events_topic], listener=_Listener(self))
            await consumer.start()
            self.consumer = consumer
            log.info(
                "table.keeping",
                state_topic=self.settings.state_topic,
                group=keeper_group(self.settings.group_id),
                partitions=events,
                verified=self.keys is not None,
            )
            try:
                while not self.stopping.is_set():
                    self._raise_failed_restore()
                    batches, _ = await reader.poll(timeout_ms=POLL_MS, max_records=MAX_RECORDS)
                    async with self.turn:
                        await self._take(batches)
                        if self.clock() - self.last_sweep >= self.sweep_every_s:
                            await self._sweep()
                        await self._seal()
            finally:
                self.forget(set(self.kept) | set(self.restoring))
                if self.auditing is not None:
                    self.auditing.cancel()
                self.consumer = None
                await consumer.stop()  # leaves the group: another keeper takes the partitions from the commits
        finally:
            await self.kafka.stop()
        return True

    def _raise_failed_restore(self) -> None:
        for task in list(self.restoring.values()):
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _take(self, batches: Mapping[TopicPartition, Sequence[Record]]) -> None:
        """Fold a poll's events, write what changed, and commit past them once written."""
        assert self.partitions is not None and self.consumer is not None
        written: dict[int, dict[bytes, Write]] = {}  # each partition's writes by key: an entry's latest only
        ends: dict[TopicPartition, int] = {}
        now = self.clock()
        for tp, records in batches.items():
            if not records:
                continue
            kept = self.kept.get(tp.partition)
            if kept is None:
                # Fetched before its restore paused it: read again once restored.
                if tp in self.consumer.assignment():
                    self.partitions.hold(tp, records[0].offset)
                continue
            for start in range(0, len(records), CHUNK):
                batch: Written = await executors.run(
                    "table",
                    kept.fold,
                    records[start : start + CHUNK],
                    self.keys,
                    self.signer,
                    now,
                    self.settings.state_retention_s,
                )
                written.setdefault(tp.partition, {}).update((write.key, write) for write in batch.writes)
                self._refused("events", batch.refused)
                self._trimmed(tp.partition, batch.trimmed)
            ends[tp] = records[-1].offset + 1
        await asyncio.gather(
            *(self.kafka.write(partition, list(writes.values())) for partition, writes in written.items() if writes)
        )
        for tp, end in ends.items():
            await self.partitions.commit(tp, end)

    async def _sweep(self) -> None:
        """Tombstone the entries ended past their retention, in every partition kept."""
        self.last_sweep = now = self.clock()
        for partition, kept in list(self.kept.items()):
            gone = await executors.run("table", kept.expired, now, self.settings.state_retention_s)
            if gone:
                await self.kafka.write(partition, gone)
                log.info("table.tombstoned", partition=partition, requests=len(gone))
        if self.auditing is None or self.auditing.done():
            self.auditing = asyncio.create_task(self._audit(list(self.kept)), name="table-audit")

    async def _seal(self) -> None:
        """Seal each partition written to since its seal, once `seal_every_s` passed since (the first at once)."""
        now = self.clock()
        for partition, kept in list(self.kept.items()):
            if not kept.unsealed or now - self.sealed_at.get(partition, -self.seal_every_s) < self.seal_every_s:
                continue
            writes = await executors.run("table", kept.seal, self.signer, uuid.uuid4().hex, now)
            await self.kafka.write(partition, writes)
            self.sealed_at[partition] = now
            log.debug("table.sealed", partition=partition, entries=len(kept.digests), records=len(writes))

    async def _audit(self, partitions: list[int]) -> None:
        """Each partition's state read again, and written over where its latest record of a key is not the keeper's
        (`Restoring.audit`). A failure is logged: the next sweep audits again."""
        for partition in partitions:
            kept = self.kept.get(partition)
            if kept is None:
                continue  # revoked meanwhile
            try:
                restoring = Restoring(partition)
                async for records in self.kafka.state(partition):
                    for start in range(0, len(records), CHUNK):
                        await executors.run("table", restoring.take, records[start : start + CHUNK], self.keys)
                async with self.turn:  # no fold writes meanwhile: what is held is what was written
                    if self.kept.get(partition) is not kept:
                        continue
                    writes = await executors.run("table", restoring.audit, kept, self.signer)
                    if writes:
                        await self.kafka.write(partition, writes)
                    kept.unsealed = True  # sealed again at the next turn: a seal another wrote over is not left
            except Exception as exc:
                log.warning("table.audit_failed", partition=partition, error=type(exc).__name__, detail=str(exc)[:300])
                continue
            self._refused("state", restoring.refused)
            if writes:
                log.warning(
                    "table.rewritten", partition=partition, records=len(writes), refused=restoring.refused.total()
                )

    def assigned(self, assigned: Collection[TopicPartition]) -> None:
        """Pause what is assigned until it is restored (a restore each, beside the loop)."""
        assert self.partitions is not None
        self.partitions.on_assigned(assigned)
        self.partitions.pause(assigned)
        for tp in assigned:
            self.restoring[tp.partition] = asyncio.create_task(self._restore(tp), name=f"table-restore-{tp.partition}")

    def forget(self, partitions: Collection[int]) -> None:
        for partition in partitions:
            task = self.restoring.pop(partition, None)
            if task is not None:
                task.cancel()
            self.kept.pop(partition, None)
            self.sealed_at.pop(partition, None)

    async def _restore(self, tp: TopicPartition) -> None:
        async with self.restore_turn:
            await self._restore_partition(tp)

    async def _restore_partition(self, tp: TopicPartition) -> None:
        restoring = Restoring(tp.partition)
        async for records in self.kafka.state(tp.partition):
            for start in range(0, len(records), CHUNK):
                await executors.run("table", restoring.take, records[start : start + CHUNK], self.keys)
        restored = await executors.run(
            "table", restoring.done, self.signer, self.clock(), self.settings.state_retention_s
        )
        if restored.writes:
            await self.kafka.write(tp.partition, restored.writes)
        self._refused("state", restored.refused)
        log.info(
            "table.restored",
            partition=tp.partition,
            entries=len(restored.kept.held),
            records=restoring.read,
            written=len(restored.writes),
            refused=restored.refused.total(),
        )
        assert self.partitions is not None
        self.kept[tp.partition] = restored.kept
        self.restoring.pop(tp.partition, None)
        if not restoring.read:
            # An empty state partition: a table never kept, or lost. Its events from their beginning make it again
            # (the committed offset says how far a table was kept, not that this one holds it).
            self.partitions.read_from(tp, 0)
        else:
            self.partitions.resume([tp])

    def _refused(self, where: str, refused: Counter[str]) -> None:
        for reason, count in refused.items():
            self._once(
                f"refused-{where}-{reason}",
                "table.record_refused",
                warning=True,
                topic=self.settings.state_topic if where == "state" else self.settings.events_topic,
                reason=reason,
                count=count,
                note="ignored, never folded; said once per reason",
            )

    def _trimmed(self, partition: int, request_ids: list[str]) -> None:
        if request_ids:
            log.warning(
                "table.entry_trimmed",
                partition=partition,
                requests=[request_id[:80] for request_id in request_ids[:5]],
                reason="larger than a record of the state topic may be: written with fewer of its recent events",
            )

    def _once(self, key: str, event: str, *, warning: bool = False, **values: object) -> None:
        if key in self.said:
            return
        self.said.add(key)
        (log.warning if warning else log.error)(event, **values)


class _Listener(ConsumerRebalanceListener):
    """The keeper told of its partitions: a revocation waits for the batch in hand (written, committed), then the
    partitions are forgotten; an assignment is restored before its events are read."""

    def __init__(self, keeper: Keeper) -> None:
        self.keeper = keeper

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        async with self.keeper.turn:
            self.keeper.forget({tp.partition for tp in revoked})
        log.info("table.partitions_revoked", partitions=sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("table.partitions_assigned", partitions=sorted(tp.partition for tp in assigned))
        self.keeper.assigned(assigned)
