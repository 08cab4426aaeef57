"""Holds and pauses from the control topic (daemon/kafka/control.py), remembered by request id until a release or
resume of the same request: a held request that waits is not started, and a paused job is stopped at a checkpoint
and its request waits held.

- Reached while held (`offer`), a request is told `held` (once per hold on this host) and is passed by as a retry not
  yet due is (daemon/jobs/waiting_retries.py): behind the requests after it, byte for byte and committed; or, with
  nothing but held requests behind it, its partition waits at it until a release, or until a new request arrives
  behind it. With priority classes a claim reached while held goes back to its class's queue, as a preempted one does
  (daemon/fleet/claimed.py `back_to_queue`); the dispatcher picks no held request from a queue (`waits`).
- A pause of a running job stops it as a daemon stop does (`Stop.interrupt`: the child saves a checkpoint within
  `drain_timeout_s`); nothing is published by the job, no attempt is spent, and then (`after_pause`) its request goes
  back to wait held, as a held one reached does, and `paused` is published with the step it stopped at. Released, the
  next host to reach it resumes from that checkpoint.
- A release (or resume: they are one) wakes the partitions waiting at a held request at once, and tells `released`
  of each request this host told `held` or `paused`. A cancel outranks a hold: it is checked first wherever a request
  is reached.
"""

from __future__ import annotations

from collections.abc import Callable, Container
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import structlog
from aiokafka import TopicPartition

from daemon.job.events import JobEvents
from daemon.job.lifecycle import State, Stop
from daemon.job.runner import JobRunner
from daemon.jobs.offered import Offered
from daemon.jobs.waiting_retries import WaitingRetries
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from schemas import Cancel, Control, Held, Hold, Pause, Paused, Released, RequestBase

if TYPE_CHECKING:
    from daemon.jobs.scheduler import Scheduler

log = structlog.get_logger()

HELD = float("inf")  # a held request's due time as a waiting retry's: only a release or a new arrival wakes it


@dataclass
class Holds:
    """The requests held now (request id → the hold's reason), and what this host did with them."""

    host: str  # this host's name, in the events it publishes
    publisher: Publisher
    partitions: Partitions
    waiting: WaitingRetries  # the scheduler's: a partition waits at a held request as at a retry not yet due
    reasons: dict[str, str] = field(default_factory=dict)
    # The requests this host told `held` or `paused`, with their events: it tells them `released`.
    told: dict[str, JobEvents] = field(default_factory=dict)
    pausing: dict[TopicPartition, str] = field(default_factory=dict)  # a running job being paused: its reason
    parked: dict[TopicPartition, str] = field(default_factory=dict)  # a partition waiting at a held request: its id
    # The held requests sent behind the others of a partition since it last reached one not held: one reached again
    # has gone round a partition of held requests only, which then waits at it rather than copying them for ever.
    rounds: dict[TopicPartition, set[str]] = field(default_factory=dict)
    on_release: list[Callable[[], None]] = field(default_factory=list)  # the dispatcher's wake, with classes
    changes: int = 0  # counts holds and releases: the dispatcher decides again when it moves

    def __contains__(self, request_id: object) -> bool:
        return request_id in self.reasons

    def unplaced(self, cancelled: Container[str]) -> Container[str]:
        """The requests neither told they wait nor counted in the places of others: cancelled, or held."""
        return _Either(cancelled, self)

    async def control(self, message: Control, scheduler: Scheduler) -> None:
        """A control message read: a hold or pause remembered (a pause stops the request's running job), a release or
        resume forgets it and wakes what waits at it; a cancel wakes a partition waiting at its request (the cancel is
        honoured when it is read again)."""
        request_id = message.request_id
        if isinstance(message, Hold | Pause):
            self.reasons[request_id] = message.reason or ("paused" if isinstance(message, Pause) else "held")
            self.changes += 1
            if isinstance(message, Pause):
                self._pause(request_id, self.reasons[request_id], scheduler)
            return
        if isinstance(message, Cancel):
            self._wake(scheduler, [tp for tp, held in self.parked.items() if held == request_id])
            return
        if self.reasons.pop(request_id, None) is None:
            return  # not held here: nothing to release
        self.changes += 1
        events = self.told.pop(request_id, None)
        if events is not None:
            await events.publish(Released, reason=message.reason or "released")
        self._wake(scheduler, list(self.parked))  # each partition is read again: the released one may be behind
        for wake in self.on_release:
            wake()

    def _pause(self, request_id: str, reason: str, scheduler: Scheduler) -> None:
        for tp, job in list(scheduler.jobs.items()):
            if job.request_id != request_id or tp in self.pausing:
                continue
            # Trained (its slots free, judged or pushed now) or pushing: too late, as for a cancel. An interrupt would
            # be taken, but it would stop a push half done for nothing: the slots are free already.
            if (
                job.placement is not None
                and job.runner.lifecycle.state is not State.PUSHING
                and job.runner.stop(Stop.interrupt(f"paused: {reason}", scheduler.settings.drain_timeout_s))
            ):
                self.pausing[tp] = reason
            else:
                log.warning("pause.too_late", request_id=request_id, stage=job.runner.stage)

    def _wake(self, scheduler: Scheduler, partitions: list[TopicPartition]) -> None:
        """Read `partitions` again from the held request each waits at: now when a slot is free, else when one frees."""
        for tp in partitions:
            self.parked.pop(tp, None)
            self.rounds.pop(tp, None)
            self.waiting.forget(tp)
            if scheduler.slots.free and tp in self.partitions.assigned() and not scheduler.holds(tp):
                self.partitions.resume([tp])

    async def offer(
        self, tp: TopicPartition, record: Record, request: RequestBase, attempt: int, scheduler: Scheduler
    ) -> Offered | None:
        """A request reached on `tp`: None when it is not held (it goes on to start); else what was done with it."""
        request_id = request.request_id
        if request_id not in self.reasons:
            self.rounds.pop(tp, None)
            return None
        if self.parked.pop(tp, None) is not None:
            self.rounds.pop(tp, None)  # woken by a new request behind it: another round, to reach that one
        await self.tell(request, record, attempt)
        if scheduler.fleet.drains:  # a claim: back to its class's queue, where the dispatcher passes it by
            if await scheduler.fleet.back_to_queue(tp, record, request):
                self.partitions.committed[tp] = record.offset + 1
                log.info("request.held", request_id=request_id, requeued=True)
                return Offered.DEFERRED
            self.partitions.hold(tp, record.offset)  # its claims partition moved: whoever holds it now reads it
            return Offered.WAITING
        gone_round = self.rounds.setdefault(tp, set())
        end = self.partitions.highwater(tp)
        if end > record.offset + 1 and request_id not in gone_round:
            gone_round.add(request_id)
            await self.publisher.deliver(self.publisher.deferred_copy(record))
            await self.partitions.commit(tp, record.offset + 1)
            log.info("request.held", request_id=request_id, partition=tp.partition, behind_others=True)
            return Offered.DEFERRED
        self.waiting.hold_at(tp, record.offset, HELD, max(end, record.offset + 1))
        self.parked[tp] = request_id
        log.info("request.held", request_id=request_id, partition=tp.partition, behind_others=False)
        return Offered.WAITING

    async def tell(self, request: RequestBase, record: Record, attempt: int) -> None:
        """A held request reached (here, or in a class's queue by the dispatcher): `held`, once a hold on this host."""
        if request.request_id in self.reasons and request.request_id not in self.told:
            events = JobEvents.for_record(self.publisher, request, self.host, attempt, record)
            await events.publish(Held, reason=self.reasons[request.request_id])
            self.told[request.request_id] = events

    async def after_pause(self, tp: TopicPartition, record: Record, runner: JobRunner, scheduler: Scheduler) -> bool:
        """After a job ended interrupted: True when it was paused and its request waits again, held (committed)."""
        reason = self.pausing.pop(tp, None)
        if reason is None:
            return False
        request = runner.request
        if scheduler.fleet.drains:
            moved = await scheduler.fleet.back_to_queue(tp, record, request)
        elif tp in self.partitions.assigned():
            # To the end of its partition, its attempt headers as they were: no attempt spent.
            await self.publisher.deliver(self.publisher.deferred_copy(record))
            await self.partitions.commit(tp, record.offset + 1)
            moved = True
        else:
            moved = False
        if not moved:  # its partition moved meanwhile: whoever holds it now reads it, held, from its checkpoint
            log.warning("job.paused_not_requeued", request_id=request.request_id)
            return False
        stopped, kept = runner.supervisor.stop_steps()
        log.warning("job.paused", request_id=request.request_id, stopped_at_step=stopped, resume_from_step=kept)
        await runner.events.publish(Paused, reason=reason, stopped_at_step=stopped, resume_from_step=kept)
        if request.request_id in self.reasons:
            self.told[request.request_id] = runner.events
        return True


@dataclass(frozen=True)
class _Either:
    first: Container[str]
    second: Container[str]

    def __contains__(self, item: object) -> bool:
        return item in self.first or item in self.second
