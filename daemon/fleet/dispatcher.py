"""The host's side of the fleet's one queue: take requests from the classes' queues while this host has room.

Each class's requests wait in a topic of their own (daemon/settings/fleet.py). This host reads a class's
topic, as a member of the group `<group_id>.queue.<class>`, only while it has a free slot, or while it
runs a job a request of the class may preempt: now, or once the job has run `preempt_min_run_s` while
no other host could start it sooner (`_reads_while_full`). A host that is full otherwise leaves the group, so
the queues' partitions belong to hosts with room, and a request never waits behind a busy host while
another has a slot (the fleet's consumer groups are its only coordination).

Each turn it looks at the first waiting records of each partition it holds (a window of them,
daemon/fleet/queues.py), picks one for each free slot (the highest class first, then the teams' fair
share, then arrival: daemon/fleet/policy/order.py, with the usage read from the events: daemon/fleet/view.py),
and moves it in one transaction into one of this host's idle claims partitions, committing the queue's
offset (daemon/fleet/moves.py); a team's cap counts this host's own claims and jobs as it knows them, not
only as their events are read back (`_mine`). The daemon runs the claims topic as it runs the requests topic without
classes: one job per partition, committed after its terminal event, read again by another host if this one dies.
A record naming another class than its topic's is weighed as its own class where it is (claimed there if
it is picked), else moved to that class's topic when it is first in its partition; one that does not decode as intake
decodes it (daemon/decoding.py: a credential, too large for a move's copies), is dead-lettered where it is (no
claim, no rejoin), and one whose cancel this host has read ends there with its `cancelled` event. A request that may
not start yet (a retry not yet due, a team at its cap, one held: daemon/jobs/holds.py, its `after` not ended:
daemon/fleet/policy/after.py), or not here (GPUs of a kind it does not ask for: daemon/fleet/policy/kinds.py
`servable`), holds up none behind it. Copies are signed by the fleet (daemon/kafka/queue_seal.py); arrival is the
fleet's (daemon/fleet/choice.py `Arrivals`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

import structlog
from aiokafka import TopicPartition

from daemon.admission.judge import on_ray
from daemon.fleet.announcer import Announcer, publish_queued
from daemon.fleet.choice import Arrivals, Head, HeadReader
from daemon.fleet.claimed import ClaimedJobs
from daemon.fleet.kinds_away import AwayForKinds
from daemon.fleet.moves import Copy, Move, Stale, carried
from daemon.fleet.policy.kinds import servable
from daemon.fleet.policy.order import FleetJob, FleetRequest
from daemon.fleet.queues import ClassQueue
from daemon.fleet.view import FleetView
from daemon.intake import Intake
from daemon.job.events import JobEvents
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.clients import FleetKafka
from daemon.ops import metrics
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER, queue_group

log = structlog.get_logger()

TURN_S = 0.2  # the longest a turn waits for a slot to free or a record to arrive
# A turn whose heads, room, claims on their way and fleet view are those of the last decision decides again only this
# long after it: what changes with time alone (a retry coming due, a job reaching `preempt_min_run_s`, a telling due
# again) is seen within it, and a host at rest does not work out the fleet's order five times a second.
DECIDE_AGAIN_S = 1.0
VIEW_WAIT_S = 30.0  # the longest the first turn waits for the fleet's view to be whole (the brokers away: it goes on)


class Dispatcher:
    def __init__(
        self,
        settings: Settings,
        scheduler: Scheduler,
        claimed: ClaimedJobs,
        intake: Intake,
        kafka: FleetKafka,
        view: FleetView,
    ) -> None:
        self.settings = settings
        self.intake = intake  # its rejections: a record too large to move is rejected here, as intake would
        self.scheduler = scheduler
        self.jobs = claimed  # the scheduler's fleet hooks: its jobs as the fleet sees them, and their preemption
        self.claims = scheduler.partitions  # this host's claims partitions, which the scheduler runs
        self.mover = claimed.mover
        self.kafka = kafka
        self.retries = claimed.retries
        self.queues = [
            ClassQueue(
                name,
                topic,
                queue_group(settings.group_id, name),
                settled=self.mover.settled,
                consumer=kafka.queue_consumer(queue_group(settings.group_id, name)),
            )
            for name, topic in settings.class_topics.items()
        ]
        self.pending: dict[
            TopicPartition, tuple[int, FleetRequest]
        ] = {}  # claims partition → the claim written there, not yet run: its offset, itself
        # The teams' usage and the fleet's running jobs, from the events, and this host's own ends at once (the
        # publisher's watcher, daemon/service.py `wire`).
        self.view = view
        self.heads = HeadReader(
            settings, intake.grants, self.retries, Arrivals(self.mover.seal)
        )  # a record as the turn weighs it
        self.away = AwayForKinds(view, scheduler.slots.kind)
        self._following: asyncio.Task[None] | None = None
        self.wake = asyncio.Event()
        self.decided: tuple[object, ...] = ()  # what the last decision read (`_seen`), and when
        self.decided_at = 0.0
        scheduler.held.on_release.append(self.wake.set)  # a released request is weighed at once

    async def start(self) -> None:
        await self.mover.start()
        self._following = asyncio.create_task(self.view.follow(), name="fleet-usage")
        for queue in self.queues:
            await queue.consumer.start()

    async def stop(self) -> None:
        if self._following is not None:
            self._following.cancel()
            await asyncio.gather(self._following, return_exceptions=True)
        for queue in self.queues:
            with contextlib.suppress(Exception):
                await queue.consumer.stop()  # leaves the group: its partitions go to hosts with room
        await self.kafka.reads.close()  # the announcer's
        await self.mover.stop()

    async def run(self, stopping: asyncio.Event) -> None:
        await self._view_whole(stopping)
        announcer = Announcer(
            self.settings,
            self.view,
            self.scheduler.publisher,
            self.claims,
            self.retries,
            self.kafka.reads,
            self.scheduler.held.unplaced(self.scheduler.cancelled),  # neither told nor counted ahead of others
            self.intake.grants,
        )
        announcing = asyncio.create_task(announcer.run(stopping), name="fleet-announcer")
        try:
            await self._turns(stopping)
        finally:
            announcing.cancel()
            await asyncio.gather(announcing, return_exceptions=True)

    async def _view_whole(self, stopping: asyncio.Event) -> None:
        """Wait until the fleet's view is whole (`FleetView.caught_up`: the table and the events past it folded, in
        seconds), so that the first picks, preemptions and tellings are not made from an empty view: every team idle,
        every request never told. At most `VIEW_WAIT_S`, or until the stop; after it, decisions read what is folded."""
        whole, stop = asyncio.create_task(self.view.caught_up.wait()), asyncio.create_task(stopping.wait())
        try:
            await asyncio.wait([whole, stop], timeout=VIEW_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (whole, stop):
                task.cancel()
        if not self.view.caught_up.is_set() and not stopping.is_set():
            log.warning("fleet.view_partial", waited_s=VIEW_WAIT_S)

    async def _turns(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.turn()
            except Stale as exc:  # a rebalance since the records were read: they are read again
                log.info("fleet.turn_stale", reason=str(exc))
            except Exception as exc:  # a broker away, a refused transaction: nothing moved, tried next turn
                log.warning("fleet.turn_failed", error=f"{type(exc).__name__}: {exc}")
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), TURN_S)

    def idle_claims(self) -> list[TopicPartition]:
        """This host's claims partitions with nothing to run: no job, no hold, no claim on its way."""
        for tp, (offset, _) in list(self.pending.items()):
            job = self.scheduler.jobs.get(tp)
            if (
                (job is not None and job.offset >= offset)
                or self.claims.committed.get(tp, 0) > offset
                or tp not in self.claims.assigned()
            ):
                del self.pending[tp]
        return sorted(
            (tp for tp in self.claims.assigned() if tp not in self.pending and not self.scheduler.holds(tp)),
            key=lambda tp: tp.partition,
        )

    def room(self) -> int:
        """Requests this host may claim now: its free slots less the claims on their way to them."""
        idle = self.idle_claims()  # first: it forgets the claims that have started
        pending = sum(1 for _, w in self.pending.values() if not self._on_ray(w))
        return max(0, min(len(self.scheduler.slots.free) - pending, len(idle)))

    def _on_ray(self, waiting: FleetRequest) -> bool:
        """Whether a request is bigger than this host (or names several hosts) and within what its Ray cluster takes
        (`[ray]`): it runs there, on none of this host's slots (daemon/admission/judge.py `runs_on_ray`)."""
        ray = self.settings.ray
        return ray is not None and on_ray(waiting.gpus, waiting.hosts, self.scheduler.slots.most_per_job(), ray)

    def ray_room(self) -> int:
        """Requests bigger than this host it may claim now: its free Ray slots (`ray.max_jobs`) less the claims of such
        requests on their way to them."""
        idle = self.idle_claims()
        pending = sum(1 for _, w in self.pending.values() if self._on_ray(w))
        return max(0, min(self.scheduler.slots.remote_free_count - pending, len(idle)))

    async def turn(self) -> None:
        if not self.mover.seal.writes_trusted:  # it would claim what every host refuses: it reads no queue
            for queue in self.queues:
                queue.follow(False)
            return
        room = self.room() + self.ray_room()
        # A host that has preempted for a request has claimed it already: it leaves a queue it can do nothing more for
        # at once, so that the rebalance gives the requests behind it to a host that can.
        for queue in self.queues:  # and out of one whose requests only other kinds of GPU serve, for a while
            queue.follow((room > 0 or self._reads_while_full(queue)) and self.away.may_read(queue))
        for queue in self.queues:
            await queue.fetch(self.heads.read, self.heads.unreadable)
        if not all(queue.known() for queue in self.queues):
            return  # a queue just joined: its waiting records are fetched first
        for queue in self.queues:
            for window in list(queue.windows.values()):
                if any(h.rejection is not None for h in window):
                    await self._reject(queue, window)
                if any(self._cancelled(h) for h in window):
                    await self._withdraw(queue, window)
                for h in window if self.scheduler.held.reasons else ():  # held: told so, and passed by below
                    if h.request is not None:
                        await self.scheduler.held.tell(h.request, h.record, self.retries.read(h.record).attempt)
        now = time.time()
        seen = self._seen(room)
        if seen == self.decided and now - self.decided_at < DECIDE_AGAIN_S:
            return  # nothing a decision reads has changed since the last one
        # A request read in another class's topic is weighed as its own class where it is: moved first, it would leave
        # this turn's heads, and its free slot would go to a lower class (it is moved below if it stays).
        ready = [
            h
            for queue in self.queues
            for h in queue.heads()
            if not h.not_yet_due(now) and h.rejection is None and h.request_id not in self.scheduler.held
        ]
        ready = [h for h in ready if h.request is None or not self.view.latest.pending(h.request.after)]  # `after`
        waiting = [h.waiting() for h in ready]
        # Requests bigger than this host, claimed for a free Ray slot of its own in the fleet's order (their team's
        # cap counts their GPUs): they take none of its GPUs, so they are weighed apart from what its slots take.
        while self.ray_room() > 0:
            bigger = self.view.pick([w for w in waiting if self._on_ray(w)], None, self._mine())
            if bigger is None:
                break
            await self._claim(bigger.key)  # type: ignore[arg-type]
            waiting.remove(bigger)
        # Its Ray slots full: the first of them in the fleet's order may preempt a job of a lower class on Ray.
        bigger = self.view.pick([w for w in waiting if self._on_ray(w)], None, self._mine())
        if bigger is not None and self.ray_room() == 0 and await self._preempt_for(bigger):
            waiting.remove(bigger)
        here = [w for w in waiting if not self._on_ray(w)]
        while here:
            free, mine = self.room(), servable(here, self.scheduler.slots.kind)  # its GPUs' kind serves these
            chosen = (
                self.view.pick(mine, free, self._mine(), here=self._here(), slots=self.scheduler.slots.total)
                if free > 0
                else None
            )
            if chosen is not None:
                await self._claim(chosen.key)  # type: ignore[arg-type]
                waiting.remove(chosen)
                here.remove(chosen)
                continue
            # Nothing fits a free slot: the first in the fleet's order that fits none may
            # preempt a job of a lower class.
            first = self.view.pick(mine, None, self._mine())
            if first is not None and await self._preempt_for(first):
                waiting.remove(first)
            break
        for queue in self.queues:
            for window in list(queue.windows.values()):
                if window and window[0].moves_to is not None:
                    await self._move(queue, window[0], window[0].moves_to)
        waiting = [w for w in waiting if isinstance(w.key, Head) and w.key.moves_to is None]
        for queue in self.queues:
            metrics.QUEUE_WAITING.labels(queue.name).set(sum(1 for w in waiting if w.priority_class == queue.name))
        await self._announce([w.key for w in waiting])  # type: ignore[misc]
        self.decided, self.decided_at = seen, now  # decided whole (a turn that failed part-way decides again)

    def _victim(self, head: FleetRequest, running: list[FleetJob], *, ever: bool = False) -> FleetJob | None:
        """The job of this host's `running` (`ClaimedJobs.running`) `head` may preempt (daemon/fleet/view.py `victim`).
        For a request bigger than the host, one of its jobs on Ray: stopping it frees a Ray slot, whatever its GPUs (the
        cluster places a job's GPUs, this host bounds how many jobs it supervises there). For any other, a job on its
        GPUs that frees enough of them with those free: a job on Ray frees none of them."""
        on_ray = self._on_ray(head)
        mine = [job for job in running if job.on_ray == on_ray]
        return self.view.victim(head, mine, head.gpus if on_ray else self.room(), ever=ever)

    async def _preempt_for(self, first: FleetRequest) -> bool:
        """Stop a job of a lower class at its checkpoint for `first` (`_victim`), and claim `first` at once: it waits in
        this host's claims for the victim's slot (the scheduler starts it when the slot frees), so no other host, in a
        rebalance meanwhile, preempts a second job for it. False when no job may be stopped for it."""
        victim = self._victim(first, self.jobs.running(self.scheduler.jobs))
        if (
            victim is None
            or not self.idle_claims()
            or not self.jobs.preempt(self.scheduler.jobs, victim.key, by=first.request_id)
        ):
            return False
        log.info("fleet.preempting", request_id=victim.request_id, by=first.request_id, host_free_slots=self.room())
        await self._claim(first.key)  # type: ignore[arg-type]
        return True

    def _seen(self, room: int) -> tuple[object, ...]:
        """What a turn's decision reads, as a value to compare: the heads (by their records), the room, the claims on
        their way, this host's jobs and the fleet view's changes."""
        heads = frozenset((h.tp, h.record.offset) for queue in self.queues for h in queue.heads())
        running = tuple(self.jobs.running(self.scheduler.jobs))  # each job's start, class, progress: what preempts
        holds = self.scheduler.held.changes
        return (heads, room, frozenset(self.pending), frozenset(self.scheduler.jobs), running, self.view.changes, holds)

    def _reads_while_full(self, queue: ClassQueue) -> bool:
        """Whether this host, full, reads a class's queue: while a request of the class may preempt one of its jobs now;
        and while one may once the job has run `preempt_min_run_s`, unless the events say another host could start it
        now (a free slot, a job old enough to stop). The minimum bounds preemption, not reading: on a full fleet a
        higher class's arrival is read at once, and its preemption waits only for the minimum. But a full member holds
        its share of the queue's partitions, where a request waits for that minimum: while another host can start it
        sooner, the partitions are left to the hosts that can. The default class's topic is where producers naming any
        class write (`adapterd submit`): read as the highest's."""
        # A request of one GPU stands for those the host's GPUs take; one bigger than the host, for those its Ray takes.
        most, ray = self.scheduler.slots.most_per_job(), self.settings.ray
        sizes = [1, most + 1] if ray is not None and most < ray.max_gpus else [1]
        running = self.jobs.running(self.scheduler.jobs)  # once: each probe below looks through the same jobs
        if any(
            self._victim(FleetRequest("", queue.name, "", 0.0, "", "", gpus), running) is not None for gpus in sizes
        ):
            return True
        arriving = (
            [c.name for c in self.settings.priority_classes]
            if queue.topic == self.settings.requests_topic
            else [queue.name]
        )
        probes = [FleetRequest("", name, "", 0.0, "", "", gpus) for name in arriving for gpus in sizes]
        return any(
            self._victim(probe, running, ever=True) is not None
            and not self.view.startable_elsewhere(self.settings.host, probe, on_ray=self._on_ray(probe))
            for probe in probes
        )

    def _mine(self) -> dict[str, tuple[str, int]]:
        """This host's own requests as it knows them now, by request id: (team, slots held) of each job, none once its
        slots are freed (`ClaimedJobs.held`), and of each claim on its way to a job."""
        return {
            **self.jobs.held(self.scheduler.jobs),
            **{w.request_id: (w.team, w.gpus) for _, w in self.pending.values()},
        }

    def _here(self) -> list[FleetJob]:
        """This host's jobs and its claims on their way to one (as started now), as it knows them: the ETAs' slots
        here."""
        now, host = time.time(), self.settings.host
        claims = [
            FleetJob(
                w.request_id,
                w.priority_class,
                w.team,
                now,
                w.method,
                w.model,
                host=host,
                gpus=w.gpus,
                steps_left=w.steps,
            )
            for _, w in self.pending.values()
        ]
        return [*self.jobs.running(self.scheduler.jobs), *claims]

    async def _announce(self, waiting: list[Head]) -> None:
        """A `queued` event for each head read and waiting past `queue_wait_event_s`, and again as it
        moves (daemon/fleet/policy/telling.py)."""
        now, telling = time.time(), self.view.telling
        heads = {
            h.request_id: h
            for h in waiting
            if h.request is not None
            and (h.request_id in telling.told or now - h.seen_at >= self.settings.queue_wait_event_s)
        }
        if not heads or not telling.maybe(heads, now):
            return
        everyone = await self.view.places_beside([h.waiting() for h in waiting], self.room(), self._here())
        placed = [each for each in everyone if each[0].request_id in heads]
        for waiting_one, place, eta in telling.due(placed, now, self.settings.host):
            head = heads[waiting_one.request_id]
            assert head.request is not None
            telling.heard(head.request_id, place, eta, now, self.settings.host)
            attempt = self.retries.read(head.record).attempt
            events = JobEvents.for_record(
                self.scheduler.publisher, head.request, self.settings.host, attempt, head.record
            )
            await publish_queued(events, head.waiting(), place, eta)
            log.info("fleet.queued", request_id=head.request_id, place=place, eta_s=eta)

    @staticmethod
    def _ours(queue: ClassQueue, head: Head) -> Callable[[], bool]:
        return lambda: queue.subscribed and head.generation == queue.generation

    def _queue(self, head: Head) -> ClassQueue:
        return next(queue for queue in self.queues if queue.name == head.queue)

    def _again(self, queue: ClassQueue, head: Head) -> Copy:
        """`head`, ahead of one taken from its window, written again at the end of its own
        partition with its arrival."""
        return Copy(
            head.record,
            head.record.topic,
            queue.name,
            head.team,
            head.arrival_ms,
            carried(head.record, self.retries),
            partition=head.record.partition,
        )

    async def _claim(self, head: Head) -> None:
        queue, target = self._queue(head), self.idle_claims()[0]
        claim = Copy(
            head.record,
            self.settings.claims_topic,
            head.priority_class,
            head.team,
            head.arrival_ms,
            (*carried(head.record, self.retries), (CLASS_HEADER, head.priority_class.encode())),
            partition=target.partition,
        )
        before = tuple(self._again(queue, h) for h in queue.ahead(head))
        offset = await self.mover.move(Move(head.record, head.group, (*before, claim), self._ours(queue, head)))
        assert offset is not None
        self.pending[target] = (offset, head.waiting())
        queue.taken(head)
        self.scheduler.resume_idle_partitions()  # the claims partition is read at once
        log.info(
            "fleet.claimed",
            request_id=head.request_id,
            priority_class=head.priority_class,
            team=head.team,
            from_partition=head.tp.partition,
            claims_partition=target.partition,
            waited_s=round(time.time() - head.arrived, 3),
        )

    async def _move(self, queue: ClassQueue, head: Head, topic: str) -> None:
        """A request first in a class's topic that names another class goes to that class's
        topic, keeping its arrival."""
        copy = Copy(
            head.record, topic, head.priority_class, head.team, head.arrival_ms, carried(head.record, self.retries)
        )
        await self.mover.move(Move(head.record, head.group, (copy,), self._ours(queue, head)))
        queue.taken(head)
        log.info("fleet.moved_to_class", request_id=head.request_id, to_topic=topic)

    async def _reject(self, queue: ClassQueue, window: list[Head]) -> None:
        """A window's records that do not decode or are too large to move: dead-lettered and announced as intake would,
        then committed past (`_end_in_window`): a flood costs a move a window."""
        rejected = [h for h in window if h.rejection is not None]
        messages = [
            message
            for h in rejected
            if h.rejection is not None
            for message in self.intake.rejection_messages(h.record, h.rejection)
        ]
        for ack in await self.scheduler.publisher.send_all(messages):
            await ack
        await self._end_in_window(queue, rejected, "fleet.rejected_in_queue")

    def _cancelled(self, head: Head) -> bool:
        return head.request is not None and head.request_id in self.scheduler.cancelled

    async def _withdraw(self, queue: ClassQueue, window: list[Head]) -> None:
        """A window's requests whose cancel this host has read: each ends here with its `cancelled` event, then is
        committed past (`_end_in_window`). Claimed first and skipped by the scheduler, each would wait for a free slot
        and an idle claims partition of its own: a swept queue took a claim a request, and its `cancelled` events came
        tens of seconds late. A retry not yet due ends too: the cancel outranks it."""
        cancelled = [h for h in window if self._cancelled(h)]
        for head in cancelled:
            assert head.request is not None
            await self.scheduler.cancelled.ended(head.request, head.record, self.retries.read(head.record).attempt)
        await self._end_in_window(queue, cancelled, "fleet.cancelled_in_queue")

    async def _end_in_window(self, queue: ClassQueue, ended: list[Head], event: str) -> None:
        """Commit past the last of `ended` (records of one window, their outcome published) in ONE move, the window's
        other records before it written again at the end of their partition."""
        last = ended[-1]
        kept = tuple(self._again(queue, h) for h in queue.ahead(last) if h not in ended)
        await self.mover.move(Move(last.record, last.group, kept, self._ours(queue, last)))
        queue.taken(last)
        log.info(
            event, priority_class=queue.name, partition=last.tp.partition, ended=len(ended), written_again=len(kept)
        )
