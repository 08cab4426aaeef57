"""The host's side of the fleet's one queue: take requests from the classes' queues while this host has room.

Each class's requests wait in a topic of their own (daemon/fleet_config.py). This host reads a class's
topic, as a member of the group `<group_id>.queue.<class>`, only while it has a free slot (or, for a
class that may preempt, while it runs a preemptible job of a lower class): a host that is full leaves
the group, so the queues' partitions always belong to hosts with room, and a request never waits
behind a busy host while another has a slot (the fleet's consumer groups are its only coordination).

Each turn it looks at the first waiting record of each partition it holds, picks one for each free
slot (`choose`: the highest class first, then the teams' fair share, daemon/fleet/choice.py), and moves it
in one transaction into one of this host's idle claims partitions, committing the queue's offset
(daemon/fleet/moves.py). The daemon runs the claims topic as it runs the requests topic without classes:
one job per partition, committed after its terminal event, read again by another host if this one dies.
A record naming another class than its topic's is moved to that class's topic; a record that does
not decode is claimed as it is, and the daemon's intake rejects it. A retry not yet due goes to the end
of its queue when requests stand behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition

from daemon.fleet.choice import Head, choose, preemption_for
from daemon.fleet.jobs import CLASS_HEADER, FleetJobs
from daemon.fleet.moves import Move, Mover
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.options import kafka_options
from daemon.kafka.partitions import Partitions
from daemon.kafka.retry_state import RetrySigner
from daemon.settings import Settings
from schemas import decode_request

log = structlog.get_logger()

TURN_S = 0.2  # the longest a turn waits for a slot to free or a record to arrive
HEARTBEAT_MS = 1000  # a queue group's members learn of a rebalance within about this long


@dataclass
class ClassQueue:
    """One class's topic, read by this host only while it wants requests of that class."""

    name: str
    topic: str
    group: str
    consumer: AIOKafkaConsumer
    subscribed: bool = False
    heads: dict[TopicPartition, Head] = field(default_factory=dict)


class _Forget(ConsumerRebalanceListener):
    def __init__(self, queue: ClassQueue) -> None:
        self.queue = queue

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        for tp in revoked:
            self.queue.heads.pop(tp, None)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        log.info("fleet.queue_assigned", priority_class=self.queue.name, partitions=sorted(tp.partition for tp in assigned))


class Dispatcher:
    def __init__(self, settings: Settings, scheduler: Scheduler, jobs: FleetJobs, claims: Partitions, mover: Mover,
                 on_waiting: Callable[[list[Head]], None] | None = None) -> None:
        self.settings = settings
        self.scheduler = scheduler
        self.jobs = jobs
        self.claims = claims
        self.mover = mover
        self.on_waiting = on_waiting  # the heads that wait this turn (for `queued` events)
        self.retries = RetrySigner.from_settings(settings.retry_key_file, settings.work_dir, settings.max_attempts)
        self.queues = [
            ClassQueue(name, topic, f"{settings.group_id}.queue.{name}", AIOKafkaConsumer(
                **kafka_options(settings), group_id=f"{settings.group_id}.queue.{name}", client_id=f"adapterd-{settings.host}-queue",
                enable_auto_commit=False, auto_offset_reset="earliest", isolation_level="read_committed",
                heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=settings.session_timeout_ms,
            ))
            for name, topic in settings.class_topics.items()
        ]
        self.pending: dict[TopicPartition, int] = {}  # claims partition → offset of the claim written there, not yet run
        self.wake = asyncio.Event()

    async def start(self) -> None:
        await self.mover.start()
        for queue in self.queues:
            await queue.consumer.start()

    async def stop(self) -> None:
        for queue in self.queues:
            with contextlib.suppress(Exception):
                await queue.consumer.stop()  # leaves the group: its partitions go to hosts with room
        await self.mover.stop()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.turn()
            except Exception as exc:  # a broker away, a refused transaction: nothing moved, tried next turn
                log.warning("fleet.turn_failed", error=f"{type(exc).__name__}: {exc}")
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), TURN_S)

    def idle_claims(self) -> list[TopicPartition]:
        """This host's claims partitions with nothing to run: no job, no hold, no claim on its way."""
        for tp, offset in list(self.pending.items()):
            job = self.scheduler.jobs.get(tp)
            if (job is not None and job.offset >= offset) or self.claims.committed.get(tp, 0) > offset or tp not in self.claims.assigned():
                del self.pending[tp]
        return sorted((tp for tp in self.claims.assigned() if tp not in self.pending and not self.scheduler.holds(tp)),
                      key=lambda tp: tp.partition)

    def room(self) -> int:
        return min(len(self.scheduler.slots.free), len(self.idle_claims()))

    async def turn(self) -> None:
        room = self.room()
        running = self.jobs.running()
        for queue in self.queues:
            self._follow(queue, room > 0 or preemption_for(queue.name, running, self.settings, time.time()) is not None)
        heads = await self._heads()
        for head in [h for h in heads if h.moves_to is not None or h.not_due_behind]:
            await self._requeue(head)
            heads.remove(head)
        now = time.time()
        while heads:
            ready = [h for h in heads if not h.not_yet_due(now)]
            if self.on_waiting is not None:
                self.on_waiting(ready)
            chosen = choose(ready, self.jobs.running(), self.settings, room=self.room())
            if chosen is None:
                break
            if self.room() >= chosen.gpus:
                await self._claim(chosen)
            else:
                victim = preemption_for(chosen.priority_class, self.jobs.running(), self.settings, now, head=chosen)
                if victim is None or not self.jobs.preempt(victim.key, by=chosen.request_id):
                    break
                log.info("fleet.preempting", request_id=victim.request_id, by=chosen.request_id)
                break  # the slot frees when the victim has saved its checkpoint; the head is taken then
            heads.remove(chosen)

    def _follow(self, queue: ClassQueue, want: bool) -> None:
        """Join the class's group while this host wants its requests; leave it otherwise."""
        if want and not queue.subscribed:
            queue.consumer.subscribe([queue.topic], listener=_Forget(queue))
            queue.subscribed = True
            log.info("fleet.queue_joined", priority_class=queue.name)
        elif not want and queue.subscribed:
            queue.consumer.unsubscribe()
            queue.subscribed = False
            queue.heads.clear()
            log.info("fleet.queue_left", priority_class=queue.name)

    async def _heads(self) -> list[Head]:
        """The first waiting record of each queue partition this host holds, decoded once and kept
        (its partition paused at it) until it is taken or the partition moves."""
        for queue in self.queues:
            if not queue.subscribed:
                continue
            batches = await queue.consumer.getmany(timeout_ms=0, max_records=500)
            for tp, records in batches.items():
                if not records or tp in queue.heads:
                    continue
                record = records[0]
                queue.consumer.seek(tp, record.offset)  # what follows is read again once this head is taken
                queue.consumer.pause(tp)
                queue.heads[tp] = self._head(queue, tp, record)
        return [head for queue in self.queues for head in queue.heads.values()]

    def _head(self, queue: ClassQueue, tp: TopicPartition, record: object) -> Head:
        decoded = decode_request(record.value or b"")  # type: ignore[attr-defined]
        request = None if not hasattr(decoded, "request_id") or not hasattr(decoded, "resources") else decoded
        retry = self.retries.read(record)  # type: ignore[arg-type]
        priority_class = getattr(request, "priority_class", None) or queue.name
        moves_to = None
        if request is not None and priority_class != queue.name and priority_class in self.settings.class_topics:
            moves_to = self.settings.class_topics[priority_class]
        behind = (queue.consumer.highwater(tp) or 0) > record.offset + 1  # type: ignore[attr-defined]
        return Head(
            record=record, tp=tp, queue=queue.name, group=queue.group, request=request, priority_class=priority_class,  # type: ignore[arg-type]
            due=retry.due, moves_to=moves_to, not_due_behind=retry.due is not None and retry.due > time.time() and behind,
            preemptions=self.retries.preemptions(record),  # type: ignore[arg-type]
        )

    def _release(self, head: Head) -> None:
        for queue in self.queues:
            if queue.heads.get(head.tp) is head:
                del queue.heads[head.tp]
                queue.consumer.seek(head.tp, head.record.offset + 1)
                queue.consumer.resume(head.tp)

    async def _claim(self, head: Head) -> None:
        target = self.idle_claims()[0]
        offset = await self.mover.move(Move(head.record, self.settings.claims_topic, head.group, partition=target.partition,
                                            headers=((CLASS_HEADER, head.priority_class.encode()),), drop=frozenset({CLASS_HEADER})))
        self.pending[target] = offset
        self._release(head)
        self.scheduler.resume_idle_partitions()  # the claims partition is read at once
        log.info("fleet.claimed", request_id=head.request_id, priority_class=head.priority_class, team=head.team,
                 from_partition=head.tp.partition, claims_partition=target.partition, waited_s=round(time.time() - head.arrived, 3))

    async def _requeue(self, head: Head) -> None:
        """A request in the wrong class's topic goes to its own; a retry not yet due goes behind the requests after it."""
        topic = head.moves_to or head.tp.topic
        await self.mover.move(Move(head.record, topic, head.group))
        self._release(head)
        log.info("fleet.requeued", request_id=head.request_id, to_topic=topic, reason="class" if head.moves_to else "retry_not_due")
