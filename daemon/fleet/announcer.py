"""`queued` events for the requests no host has read yet: each gets one soon after it arrives, with its
place in the fleet's order and an ETA, so a producer learns at once how long it will wait, and another whenever
they move materially (daemon/fleet/telling.py: once an ETA can be said where none could, or when heavier teams or
a higher class go ahead).

A host with no room does not read the queues (daemon/fleet/dispatcher.py), so the requests waiting
behind a busy fleet are read for this from the outside, without joining a group: each class's topic
from its queue group's committed offset (`QueueReads`, daemon/kafka/clients.py), every `ANNOUNCE_S`. One host
does it, the one the claims group gave partition 0 (Kafka's own assignment chooses it: no election of
ours); after a rebalance another may, and the events say what each request was last told
(`FleetView.telling`), so the new one goes on from there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Container

import structlog
from aiokafka import TopicPartition

from daemon.errors import TopicMissing
from daemon.fleet.order import FleetRequest, waiting_for
from daemon.fleet.view import FleetView
from daemon.job.events import JobEvents
from daemon.kafka.clients import QueueReads
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.settings import Settings
from daemon.settings.fleet import queue_group
from schemas import Queued, RequestBase, decode_request

log = structlog.get_logger()

ANNOUNCE_S = 2.0  # how soon after its arrival a request read by no host is told its place
MAX_READ = 2000  # the records of one class's topic read for it, at most: beyond, no place is said


async def publish_queued(
    publisher: Publisher,
    host: str,
    retries: RetrySigner,
    read: tuple[RequestBase, Record],
    waiting: FleetRequest,
    place: int,
    eta: float | None,
) -> None:
    """A waiting request's `queued` event, with its place and ETA (this round's: tenths of a second, none below 0), as
    its attempt and trace headers say (the dispatcher's for a request it read, the announcer's for one no host has)."""
    request, record = read
    events = JobEvents.for_record(publisher, request, host, retries.read(record).attempt, record)
    await events.publish(
        Queued,
        priority_class=waiting.priority_class,
        team=waiting.team,
        place=place,
        eta_s=None if eta is None else round(max(0.0, eta), 1),
    )


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
        last (daemon/fleet/telling.py); how many were published."""
        view = self.view
        unread = [(w, read) for w, read in await self.unread() if w.request_id not in self.cancelled]
        now = time.time()
        if not view.telling.maybe([w.request_id for w, _ in unread], now):
            return 0  # every one told too recently to be told again
        placed = view.places([w for w, _ in unread], 0)
        if not view.telling.due(placed, now, self.settings.host, dry=True):
            return 0  # every one told, and nothing moved since
        # A host may have claimed one while the queues were read (its claim commits the queue's offset past the record,
        # in the claim's own transaction): told `queued` now, its consumers would see it wait after its `started`.
        taken = await self.claimed([record for _, (_, record) in unread])
        if taken:  # the others' places are worked out again without them
            unread = [
                (w, read) for w, read in unread if (read[1].topic, read[1].partition, read[1].offset) not in taken
            ]
            placed = view.places([w for w, _ in unread], 0)
        records = {waiting.request_id: read for waiting, read in unread}
        published = 0
        for waiting, place, eta in view.telling.due(placed, now, self.settings.host):
            view.telling.heard(waiting.request_id, place, eta, now, self.settings.host)
            await publish_queued(
                self.publisher, self.settings.host, self.retries, records[waiting.request_id], waiting, place, eta
            )
            published += 1
        return published

    async def claimed(self, records: list[Record]) -> set[tuple[str, int, int]]:
        """Of these records of the classes' topics, those their queue group has committed past since they were read."""
        groups = {
            topic: queue_group(self.settings.group_id, name) for name, topic in self.settings.class_topics.items()
        }
        found = await self.reads.committed({(groups[record.topic], record.topic) for record in records})
        return {
            (r.topic, r.partition, r.offset)
            for r in records
            if found[(groups[r.topic], r.topic)].get(r.partition, 0) > r.offset
        }

    async def unread(self) -> list[tuple[FleetRequest, tuple[RequestBase, Record]]]:
        """The requests of each class's topic past its group's committed offset, decoded as the dispatcher decodes
        them."""
        topics = self.settings.class_topics
        found = await self.reads.committed(
            [(queue_group(self.settings.group_id, name), topic) for name, topic in topics.items()]
        )
        running = {job.request_id for job in self.view.running_jobs.jobs(time.time())}
        unread: list[tuple[FleetRequest, tuple[RequestBase, Record]]] = []
        for name, topic in topics.items():
            try:
                records = await self.reads.waiting(
                    topic, found[(queue_group(self.settings.group_id, name), topic)], MAX_READ
                )
            except TopicMissing:
                continue
            for record in records:
                request = decode_request(record.value or b"", record.key)
                if not isinstance(request, RequestBase) or request.request_id in running:
                    continue
                unread.append(
                    (waiting_for(request, request.priority_class or name, record.timestamp / 1000), (request, record))
                )
        return unread
