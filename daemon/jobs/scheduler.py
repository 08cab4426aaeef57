"""Which request runs where and when: GPU slots, one job per partition, retries and cancels.

- A valid request starts when enough slots are free; its partition is paused while its job runs.
  A request that does not fit stays in Kafka (its partition paused at it) until a slot frees.
  A job's slots free when its child exits with its result, not when it ends: the next request
  trains while this one is judged and pushed (its partition stays held until it is committed).
- A job's outcome decides what happens to its record: committed after a terminal event; sent back
  to the end of its partition for another try after `retrying` (with the attempt and the time it
  is due in headers); also dead-lettered after a retryable failure on the last try (daemon/jobs/settle.py).
- A retry read before it is due holds no slot and blocks no request behind it: it is sent to the
  end of its partition again. Only when nothing stands behind it does its partition wait, until it
  is due or until a new request arrives behind it (`wake`; daemon/jobs/waiting_retries.py).
- A cancel stops the running job, or skips the request when it is reached.
- A request's memory estimate is worked out beside the loop (daemon/resources/estimates.py): its
  partition is held at it meanwhile (`ESTIMATING`), and read again when the estimate is ready. The
  estimate plans the job: a whole copy on each GPU, or sharded, or rejected (daemon/resources/shards.py).
- A request of several GPUs held for want of free slots for `reserve_after_s` has the host reserved for it: no
  other job starts unless it is expected to end before the reservation is due (daemon/jobs/reservation.py). With
  priority classes the dispatcher claims only what fits the free slots, and drains the host itself
  (daemon/fleet/policy/drain.py): nothing is reserved here.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import structlog
from aiokafka import TopicPartition

from daemon.admission.judge import runs_on_ray
from daemon.children.processes import ChildSource
from daemon.job.lifecycle import Stop
from daemon.job.plan import JobPlace, MemoryPlan
from daemon.job.runner import Arrival, JobRunner, JobServices
from daemon.job.supervisor import time_limit
from daemon.jobs.cancels import Cancels
from daemon.jobs.faults import RecordFaults
from daemon.jobs.fleet_hooks import NO_FLEET, FleetHooks
from daemon.jobs.holds import Holds
from daemon.jobs.offered import Offered, RunningJob
from daemon.jobs.prerequisites import Prerequisites
from daemon.jobs.reservation import Reservations, backfills
from daemon.jobs.settle import Settler
from daemon.jobs.waiting_retries import WaitingRetries
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.kafka.retry_state import RetrySigner
from daemon.kafka.trace import trace_context
from daemon.resources.estimates import Estimates
from daemon.resources.estimator import Estimator, MemoryHistory
from daemon.resources.memory import Estimate
from daemon.resources.shards import PLANS, planned
from daemon.resources.slots import Placement, Slots
from daemon.settings import Settings
from schemas import Accepted, Cancel, Control, RequestBase

log = structlog.get_logger()


class Scheduler:
    def __init__(
        self,
        settings: Settings,
        publisher: Publisher,
        partitions: Partitions,
        slots: Slots,
        children: ChildSource,
        on_change: Callable[[], None],
        fleet: FleetHooks = NO_FLEET,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.partitions = partitions
        self.slots = slots
        self.children = children
        self.on_change = on_change  # jobs or slots changed: the daemon updates its systemd status
        self.jobs: dict[TopicPartition, RunningJob] = {}
        self.waiting = WaitingRetries(publisher, partitions)  # retries not yet due (daemon/jobs/waiting_retries.py)
        self.cancelled = Cancels(settings.host, publisher, partitions)  # the control topic's (daemon/jobs/cancels.py)
        self.held = Holds(settings.host, publisher, partitions, self.waiting)  # holds, pauses: daemon/jobs/holds.py
        # Each job's memory, before it is placed on a shared GPU (daemon/resources/estimator.py).
        self.memory = Estimator(settings, MemoryHistory.load(settings.work_dir / "memory.json"))
        self.estimates = Estimates(on_done=self._estimated)  # those worked out beside the loop
        # Reads and signs a retry's attempt and due time (daemon/kafka/retry_state.py).
        self.retries = RetrySigner.from_settings(settings.retry_key_file, settings.work_dir, settings.max_attempts)
        self.faults = RecordFaults(settings, publisher, partitions)  # records failing outside their job
        self.settler = Settler(
            settings.retry_backoff_s, publisher, partitions, self.retries, self.faults
        )  # its record after a job's end
        self.fleet = fleet  # with priority classes: claimed jobs, and preemption (daemon/fleet/claimed.py)
        # The requests of several GPUs waiting at their partitions' heads, and the one the host is reserved for.
        self.reservations = Reservations(settings.reserve_after_s)
        self.clock = clock  # the reservations' and jobs' start times (a test's own clock moves them)
        # Requests waiting for others (`after`) and what each starts from (daemon/jobs/prerequisites.py).
        self.prerequisites = Prerequisites(settings, publisher, partitions, clock=clock)
        self.stopping = False

    def holds(self, tp: TopicPartition) -> bool:
        """Whether `tp` is paused for a reason of the scheduler's (a running job, a retry not yet due,
        an estimate being worked out, a request waiting for its `after`)."""
        return tp in self.jobs or tp in self.waiting or self.estimates.running(tp) or tp in self.prerequisites

    async def offer(self, tp: TopicPartition, record: Record, request: RequestBase) -> Offered:
        """Take a valid request: start its job, hold its partition, or pass it by (see `Offered`)."""
        retry = self.retries.read(record)
        self.reservations.offered(tp, record.offset)
        if request.request_id in self.cancelled:
            self.reservations.gone(tp)
            await self.cancelled.skip(tp, record, request, retry.attempt)
            return Offered.SKIPPED
        if (held := await self.held.offer(tp, record, request, retry.attempt, self)) is not None:
            self.reservations.gone(tp)
            return held
        if retry.due is not None and retry.due > time.time():
            self.reservations.gone(tp)
            return Offered.DEFERRED if await self.waiting.not_yet(tp, record, retry.due) else Offered.WAITING
        waited = await self.prerequisites.offer(tp, record, request, retry.attempt)  # its `after` not all succeeded
        if waited is not None:
            self.reservations.gone(tp)
            return waited
        if runs_on_ray(request, self.settings, self.slots):  # bigger than this host: a run on the Ray cluster
            self.reservations.gone(tp)
            remote = self.slots.take_remote()
            if remote is None:
                self.partitions.hold(tp, record.offset)  # until one of this host's Ray jobs ends
                self.pause_idle_partitions()
                return Offered.NO_SLOT
            self._start(tp, record, request, remote, retry.attempt, None)
            return Offered.STARTED
        # Its memory, on a GPU host (or for a local model: its headers are on this disk): its plan (a whole copy on
        # each GPU or sharded, or rejected when it fits neither way: daemon/resources/shards.py, raising Unfit, which
        # intake rejects), and its share of a GPU when GPUs are packed (never for a job sent back to run alone, nor
        # one of several GPUs: `Slots.take`). A job of several GPUs is estimated only where the GPUs' memory is known:
        # elsewhere there is nothing to plan it by, and it starts without waiting for its models' headers.
        whole = None
        plannable = request.resources.gpus == 1 or self.slots.gpu_room is not None
        if plannable and (self.slots.gpus or request.model.id.startswith("/")):
            ready, whole = self.estimates.ready(self.memory, tp, record.offset, request)
            if not ready:  # worked out beside the loop: read again when it is ready (`_estimated`)
                self.partitions.hold(tp, record.offset)
                return Offered.ESTIMATING
        plan = planned(request, whole, self.memory, self.slots.gpu_room, self.slots.most_per_job())
        request, need = plan.request, plan.estimate
        placement = self.slots.take(request.resources.gpus, None if need is None or retry.alone else need.needed)
        if placement is not None and not self._may_start(tp, request, placement):
            self.slots.give_back(placement)  # the host is reserved for a request of several GPUs
            placement = None
        if placement is None:
            if not self.fleet.drains and 1 < request.resources.gpus <= self.slots.total:
                self.reservations.waiting(tp, record.offset, request.request_id, request.resources.gpus, self.clock())
            self.partitions.hold(tp, record.offset)  # until a job ends and frees its slots (or its memory)
            self.pause_idle_partitions()
            return Offered.NO_SLOT
        self.reservations.gone(tp)
        self._start(tp, record, request, placement, retry.attempt, need)
        return Offered.STARTED

    def _may_start(self, tp: TopicPartition, request: RequestBase, placement: Placement) -> bool:
        """Whether a job may take `placement` now: always, unless the host is reserved for another partition's request
        of several GPUs (daemon/jobs/reservation.py); then only when it puts the reservation off no later (backfill)."""
        now = self.clock()
        held = self.reservations.reserved(now)
        if held is None or held.key == tp:
            return True
        free_at = dict.fromkeys(self.slots.names, now)
        for job in self.jobs.values():
            if job.placement is not None:
                for slot in job.placement.slots:
                    free_at[slot] = max(free_at[slot], self._expected_end(job, now))
        limit = time_limit(request.timeout_s, self.settings.max_timeout_s)
        end = None if limit is None else now + limit
        if backfills(free_at, placement.slots, end, held.gpus):
            log.info("job.backfilled", request_id=request.request_id, reserved_for=held.request_id, ends_by=end)
            return True
        log.info(
            "job.held_for_reservation", request_id=request.request_id, reserved_for=held.request_id, gpus=held.gpus
        )
        return False

    def _expected_end(self, job: RunningJob, now: float) -> float:
        """When a running job is expected to free its slots: its last progress ETA, else its start plus its time limit
        (the supervisor stops it then), else unknown (inf)."""
        supervisor = job.runner.supervisor
        eta_s, at = supervisor.progress.get("eta_s"), supervisor.progress_at
        if eta_s is not None and at is not None:
            return max(now, at + float(eta_s))
        limit = supervisor.timeout_s
        return math.inf if limit is None else max(now, job.started + limit)

    def _estimated(self, tp: TopicPartition) -> None:
        """A held record's estimate is ready: its partition is read again, now if a slot is free (else
        when one frees, `resume_idle_partitions`)."""
        if not self.stopping and self.slots.free and tp in self.partitions.assigned() and not self.holds(tp):
            self.partitions.resume([tp])

    def wake(self, end_offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Resume the partitions of waiting retries that are due, or that have requests behind them."""
        for tp in [*self.waiting.due(time.time(), end_offsets), *self.prerequisites.due()]:
            if self._room():
                self.partitions.resume([tp])

    def _start(
        self,
        tp: TopicPartition,
        record: Record,
        request: RequestBase,
        placement: Placement,
        attempt: int,
        need: Estimate | None,
    ) -> None:
        self.slots.count()
        if request.experimental:
            log.warning("job.experimental_method", request_id=request.request_id, method=request.method)
        self.partitions.hold(tp, record.offset + 1)
        runner = JobRunner(
            Arrival(
                request, record.timestamp / 1000, attempt, trace_context(record), self.prerequisites.start_of(request)
            ),
            JobServices(self.settings, self.publisher, self.children),
            JobPlace.on(self.slots, placement),
            memory=MemoryPlan(need, self.slots.gpu_room, self.memory),
            on_trained=functools.partial(self._free_slots, tp, record.offset),
        )
        task = asyncio.create_task(self._run(tp, record, runner), name=f"job-{request.request_id}")
        self.jobs[tp] = RunningJob(request.request_id, record.offset, runner, placement, task, started=self.clock())
        self.pause_idle_partitions()
        self.on_change()

    async def _run(self, tp: TopicPartition, record: Record, runner: JobRunner) -> None:
        offset = record.offset
        try:
            fleet = self.fleet.accepted_fields(tp, record, runner.request)
            estimate = runner.memory.estimate
            await runner.events.publish(
                Accepted,
                method=runner.request.method,
                plan=PLANS[runner.request.resources.shard],
                estimate_bytes_per_gpu=estimate.needed if estimate is not None else None,
                **fleet,
            )
            event = await runner.run()
            if event is None:
                # Interrupted: nothing published, nothing committed; the request is read again. A preempted
                # one is back in its class's queue, its claim committed in the same transaction.
                # A paused one waits again, held (daemon/jobs/holds.py): first, as a pause outranks a preemption.
                if await self.held.after_pause(tp, record, runner, self) or await self.fleet.after_interrupt(
                    tp, record, runner
                ):
                    self.partitions.committed[tp] = offset + 1
                return
            requeue = functools.partial(self.fleet.requeued, record, runner.request)
            if not await self.settler.settle(tp, record, runner, event, requeue):
                return  # its retry refused: ended (or held) by the faults' path
        except Exception as exc:
            # A fault outside the job itself (the broker refused an event, a bug): read the request
            # again rather than lose it, but not for ever (daemon/jobs/faults.py).
            log.exception("job.error", request_id=runner.request.request_id, offset=offset)
            await self.faults.failed(tp, record, runner, exc)
        else:
            self.faults.clear(tp, offset)
        finally:
            job = self.jobs.get(tp)
            if job is not None and job.offset == offset:
                del self.jobs[tp]
                self._give_back(job)
                self.fleet.forget(tp)
            await self._slots_changed()

    async def _free_slots(self, tp: TopicPartition, offset: int) -> None:
        """A job's child has exited with its result: its slots take the next request while the job is
        judged and pushed. Its partition stays held until its terminal event is committed."""
        job = self.jobs.get(tp)
        if job is None or job.offset != offset or job.placement is None:
            return
        log.info("job.slots_freed", request_id=job.request_id, slots=job.placement.slots)
        self._give_back(job)
        await self._slots_changed()

    async def _slots_changed(self) -> None:
        """Slots freed (unless the daemon is stopping): idle partitions read again, a warm child for each free slot."""
        if not self.stopping:
            self.resume_idle_partitions()
            await self.prepare_children()
            self.on_change()

    def _give_back(self, job: RunningJob) -> None:
        if job.placement is not None:  # given back once: when the child is done, or when the job ends without one
            self.slots.give_back(job.placement)
            job.placement = None
        self.slots.count()

    async def prepare_children(self) -> None:
        """A warm child for each free slot, its devices set, so the next one-GPU job starts at once."""
        await self.children.prepare([self.slots.visible_devices([slot]) for slot in self.slots.free])

    def let_go(self, tp: TopicPartition, next_offset: int) -> bool:
        """After `offer` raised for the record before `next_offset` (rejected in its place): what the
        offer left held of `tp` is let go and `tp` is read on from `next_offset`. False, and nothing
        changed, when the offer had started that record's job (the job ends it)."""
        if tp in self.jobs:  # held before the offer, it would not have been made: this record's job
            return False
        self.reservations.gone(tp)
        self.waiting.forget(tp)
        self.prerequisites.forget(tp)
        self.estimates.forget(tp)
        self.partitions.read_from(tp, next_offset)
        self.pause_idle_partitions()
        return True

    def _room(self) -> bool:
        """Whether a request read now could start: a slot of this host's free, or one of its Ray jobs'."""
        return bool(self.slots.free) or self.slots.remote_free

    def pause_idle_partitions(self) -> None:
        if not self._room():
            self.partitions.pause([tp for tp in self.partitions.assigned() if not self.holds(tp)])

    def resume_idle_partitions(self) -> None:
        if self._room():
            self.partitions.resume([tp for tp in self.partitions.assigned() if not self.holds(tp)])

    async def control(self, message: Control) -> None:
        """From the control topic: a cancel, or a hold, release, pause or resume (daemon/jobs/holds.py)."""
        if isinstance(message, Cancel):
            await self.cancel(message)
        await self.held.control(message, self)

    async def cancel(self, cancel: Cancel) -> None:
        """From the control topic: stop the request's running job, or remember to skip it."""
        reason = self.cancelled.remember(cancel)
        for job in list(self.jobs.values()):
            if job.request_id == cancel.request_id and not job.runner.stop(Stop("cancel", reason)):
                log.warning("cancel.too_late", request_id=cancel.request_id, stage=job.runner.stage)

    async def on_assigned(self, assigned: set[TopicPartition]) -> None:
        """After a rebalance: keep running jobs' partitions paused; stop jobs whose partition moved away."""
        for tp, job in list(self.jobs.items()):
            if tp in assigned:
                # New assignments start unpaused at the committed offset, which is this job's request.
                self.partitions.hold(tp, job.offset + 1)
            else:
                log.warning("job.partition_moved", request_id=job.request_id, partition=tp.partition)
                job.runner.stop(Stop.interrupt("partition moved", self.settings.drain_timeout_s))
        self.waiting.forget_all()  # their partitions start again at the retry, which is read anew
        self.prerequisites.forget_all()  # and at a request waiting for its `after`
        self.reservations.keep(assigned)  # a head still here is read again at the same offset, and keeps its wait
        self.estimates.forget_all()  # their records are read again from the committed offsets
        self.pause_idle_partitions()

    async def stop_jobs(self) -> None:
        """Stop running jobs without committing them: each saves a checkpoint (within `drain_timeout_s`)
        and its request is read again after a restart, resuming there."""
        self.stopping = True
        self.estimates.forget_all()
        for job in self.jobs.values():
            # A job whose outcome is published is not stopped: it commits rather than being read again.
            job.runner.stop(Stop.interrupt("daemon stopping", self.settings.drain_timeout_s))
        await asyncio.gather(*(job.task for job in self.jobs.values()), return_exceptions=True)

    def status(self) -> list[dict[str, Any]]:
        return [
            {**job.runner.status(), "partition": tp.partition, "offset": job.offset}
            for tp, job in list(self.jobs.items())
        ]
