"""`queued` events for the requests no host has read yet: each gets one soon after it arrives, with its
place in the fleet's order and an ETA, so a producer learns at once how long it will wait, and another whenever
they move materially (daemon/fleet/policy/telling.py: once an ETA can be said where none could, or when heavier teams or
a higher class go ahead).

A host with no room does not read the queues (daemon/fleet/dispatcher.py), so the requests waiting
behind a busy fleet are read for this from the outside, without joining a group: each class's topic
from its queue group's committed offset (`QueueReads`, daemon/kafka/clients.py), every `ANNOUNCE_S`. One host
does it, the one the claims group gave partition 0 (Kafka's own assignment chooses it: no election of
ours); after a rebalance another may, and the events say what each request was last told
(`FleetView.telling`), so the new one goes on from there.

Each record is read and decoded once (`Unreads`): as intake decodes it (daemon/decoding.py), each in a worker thread
of the `decode` pool, CHUNK records at a time (a round's 2,000 small requests decoded, and their grants checked, on
the loop held it half a second; a topic of 1 MB requests never holds it either); kept between rounds by its topic,
partition and offset (what its `queued` events need, not its bytes) until its group commits past it; a round reads
only the records past those it has read. At rest, with nothing new, a round reads and decodes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass

import structlog
from aiokafka import TopicPartition

from daemon import decoding, executors
from daemon.admission.grants import Grants
from daemon.errors import TopicMissing
from daemon.fleet.policy.order import FleetRequest, waiting_for
from daemon.fleet.view import FleetView
from daemon.job.events import JobEvents
from daemon.kafka.clients import QueueReads
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.settings import Settings
from daemon.settings.fleet import queue_group
from schemas import Queued, RequestBase

log = structlog.get_logger()

ANNOUNCE_S = 2.0  # how soon after its arrival a request read by no host is told its place
MAX_READ = 2000  # the records of one class's topic kept for it, at most: beyond, no place is said
CHUNK = 64  # the records a worker thread decodes at once
# The places of the same unread requests, on a view that folded nothing since, are worked out again only this long
# after: nothing they are made of moved but the clock (a running job past its ETA), and working out the order of
# thousands of waiting requests every round held the loop (benchmarks.fleet_scale: 0.14 of a core at rest, the loop
# held 0.56 s, with 10,000 waiting).
PLACE_AGAIN_S = 30.0


async def publish_queued(events: JobEvents, waiting: FleetRequest, place: int, eta: float | None) -> None:
    """A waiting request's `queued` event, with its place and ETA (this round's: tenths of a second, none below 0), as
    its attempt and trace headers say (`events`: the dispatcher's for a request it read, the announcer's for one no
    host has)."""
    await events.publish(
        Queued,
        priority_class=waiting.priority_class,
        team=waiting.team,
        place=place,
        eta_s=None if eta is None else round(max(0.0, eta), 1),
    )


@dataclass(frozen=True)
class Unread:
    """A request of a class's topic no host has read, as the announcer keeps it: its place in the fleet's order, where
    its record is, and its `queued` events' fields (id, metadata, attempt, trace headers): never its bytes."""

    waiting: FleetRequest
    where: tuple[str, int, int]  # its record's topic, partition and offset
    events: JobEvents


@dataclass(frozen=True)
class NamedRequest:
    """What a `queued` event carries of its request (daemon/job/events.py `Named`)."""

    request_id: str
    metadata: dict[str, str]


class Unreads:
    """The records of the classes' topics past their queue groups' committed offsets, each read, decoded and its
    grant checked once: kept by partition and offset (a record that is no request too, as None, so it is not decoded
    again), at most MAX_READ a topic, forgotten once its group has committed past it. `read` reads only past what it
    has read."""

    def __init__(
        self, settings: Settings, publisher: Publisher, retries: RetrySigner, reads: QueueReads, grants: Grants
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.retries = retries
        self.reads = reads
        self.grants = grants
        # topic → partition → offset → the request read there (None: no request; a daemon rejects it where it is)
        self.kept: dict[str, dict[int, dict[int, Unread | None]]] = {}
        self.next: dict[tuple[str, int], int] = {}  # where each partition is read next

    async def read(self, priority_class: str, topic: str, committed: Mapping[int, int]) -> list[Unread]:
        """The requests of `topic` (the class's) past `committed` (its group's offsets), in partition order."""
        kept = self.kept.setdefault(topic, {})
        for partition, by_offset in kept.items():
            behind = committed.get(partition, 0)
            while by_offset and (first := next(iter(by_offset))) < behind:  # kept in offset order: the first go
                del by_offset[first]
        room = MAX_READ - sum(len(by_offset) for by_offset in kept.values())
        if room > 0:
            partitions = {*committed, *(p for t, p in self.next if t == topic)}
            start = {p: max(committed.get(p, 0), self.next.get((topic, p), 0)) for p in partitions}
            try:
                records = await self.reads.waiting(topic, start, room)
            except TopicMissing:
                self.forget(topic)
                raise
            for first in range(0, len(records), CHUNK):
                chunk = records[first : first + CHUNK]
                found = await executors.run("decode", self.unread_all, priority_class, chunk)
                for record, each in zip(chunk, found, strict=True):
                    # Past it only once it is kept: a round cancelled during its decode reads it again.
                    kept.setdefault(record.partition, {})[record.offset] = each
                    self.next[(topic, record.partition)] = record.offset + 1
        return [each for partition in sorted(kept) for each in kept[partition].values() if each is not None]

    def unread_all(self, priority_class: str, records: Sequence[Record]) -> list[Unread | None]:
        return [self.unread(priority_class, record) for record in records]

    def unread(self, priority_class: str, record: Record) -> Unread | None:
        """A record as the announcer keeps it; None for one that is no request, or whose team or class is not granted
        to its writer (a daemon rejects it)."""
        try:
            request = decoding.decoded_now(record, self.settings.max_message_bytes)
        except Exception as exc:  # a bug of ours met by this record: not told it waits, and the round goes on
            log.warning("fleet.announce_undecoded", topic=record.topic, offset=record.offset, error=type(exc).__name__)
            return None
        if not isinstance(request, RequestBase):
            return None
        priority_class = request.priority_class or priority_class
        # Its writer's grant, as the dispatcher checks it at the head (a refused one is dead-lettered there).
        if self.grants.refusal(request, record.value, record.headers, priority_class) is not None:
            return None
        named = NamedRequest(request.request_id, dict(request.metadata))
        events = JobEvents.for_record(
            self.publisher, named, self.settings.host, self.retries.read(record).attempt, record
        )
        waiting = waiting_for(request, priority_class, record.timestamp / 1000)
        return Unread(waiting, (record.topic, record.partition, record.offset), events)

    def forget(self, topic: str) -> None:
        """A topic gone (deleted, perhaps made again from offset 0): what was read of it."""
        self.kept.pop(topic, None)
        for where in [where for where in self.next if where[0] == topic]:
            del self.next[where]


class Announcer:
    def __init__(
        self,
        settings: Settings,
        view: FleetView,
        publisher: Publisher,
        claims: Partitions,
        retries: RetrySigner,
        reads: QueueReads,
        cancelled: Container[str] = frozenset(),
        grants: Grants | None = None,
    ) -> None:
        self.settings = settings
        self.reads = reads  # the queues from outside their groups (daemon/kafka/clients.py)
        # The requests whose cancel this host has read (Scheduler.cancelled): skipped when reached, so neither told
        # they wait nor counted in the places of the others.
        self.cancelled = cancelled
        self.view = view
        self.publisher = publisher
        self.claims = claims
        self.retries = retries
        # The teams' grants (the dispatcher's, which intake's are: daemon/admission/grants.py).
        grants = grants if grants is not None else Grants.from_settings(settings.teams)
        self.unreads = Unreads(settings, publisher, retries, reads, grants)
        self.placed: tuple[object, ...] = ()  # the requests and the view's changes the last places were worked out of
        self.placed_at = 0.0

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), ANNOUNCE_S)
            if stopping.is_set() or TopicPartition(self.settings.claims_topic, 0) not in self.claims.assigned():
                continue
            try:
                await self.announce()
            except Exception as exc:  # the brokers away: tried again at the next round
                log.warning("fleet.announce_failed", error=f"{type(exc).__name__}: {exc}")

    async def announce(self) -> int:
        """One round: a `queued` event for each unread request that has none, or whose place or ETA moved since its
        last (daemon/fleet/policy/telling.py); how many were published."""
        view = self.view
        unread = [each for each in await self.unread() if each.waiting.request_id not in self.cancelled]
        now = time.time()
        if not view.telling.maybe([each.waiting.request_id for each in unread], now):
            return 0  # every one told too recently to be told again
        seen = (frozenset(each.where for each in unread), view.changes)
        if seen == self.placed and now - self.placed_at < PLACE_AGAIN_S:
            return 0  # the same requests on the same view: their places have not moved
        placed = await view.places_beside([each.waiting for each in unread], 0)
        self.placed, self.placed_at = seen, now
        if not view.telling.due(placed, now, self.settings.host, dry=True):
            return 0  # every one told, and nothing moved since
        # A host may have claimed one while the queues were read (its claim commits the queue's offset past the record,
        # in the claim's own transaction): told `queued` now, its consumers would see it wait after its `started`.
        taken = await self.claimed([each.where for each in unread])
        if taken:  # the others' places are worked out again without them
            unread = [each for each in unread if each.where not in taken]
            placed = await view.places_beside([each.waiting for each in unread], 0)
        events = {each.waiting.request_id: each.events for each in unread}
        published = 0
        for waiting, place, eta in view.telling.due(placed, now, self.settings.host):
            view.telling.heard(waiting.request_id, place, eta, now, self.settings.host)
            await publish_queued(events[waiting.request_id], waiting, place, eta)
            published += 1
        return published

    async def claimed(self, records: Iterable[tuple[str, int, int]]) -> set[tuple[str, int, int]]:
        """Of these records of the classes' topics (topic, partition, offset), those their queue group has committed
        past since they were read."""
        records = list(records)
        groups = {
            topic: queue_group(self.settings.group_id, name) for name, topic in self.settings.class_topics.items()
        }
        found = await self.reads.committed({(groups[topic], topic) for topic, _, _ in records})
        return {
            (topic, partition, offset)
            for topic, partition, offset in records
            if found[(groups[topic], topic)].get(partition, 0) > offset
        }

    async def unread(self) -> list[Unread]:
        """The requests of each class's topic past its group's committed offset, decoded as the dispatcher decodes
        them, once each (`Unreads`)."""
        topics = self.settings.class_topics
        found = await self.reads.committed(
            [(queue_group(self.settings.group_id, name), topic) for name, topic in topics.items()]
        )
        running = {job.request_id for job in self.view.running_jobs.jobs(time.time())}
        unread: list[Unread] = []
        for name, topic in topics.items():
            try:
                read = await self.unreads.read(name, topic, found[(queue_group(self.settings.group_id, name), topic)])
            except TopicMissing:
                continue
            unread += [each for each in read if each.waiting.request_id not in running]
        return unread
