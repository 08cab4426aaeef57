"""The Kafka loop: consume requests, reject what is invalid, run the rest beside the loop.

Delivery rules (see shared DESIGN.md):
- An offset is committed only after the request's terminal event is acknowledged by the broker.
- One job per partition: the partition is paused while its job runs, and the loop keeps polling,
  so heartbeats and `max_poll_interval_ms` stay satisfied through long jobs.
- As many jobs at once as the host has free slots (one per GPU); a request that does not fit
  stays in Kafka (its partition paused) until a slot frees.
- A cancel on the control topic stops the running job, or skips the request when it is reached.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.range import RangePartitionAssignor
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
from aiokafka.coordinator.assignors.sticky.sticky_assignor import (
    StickyPartitionAssignor,
)
from aiokafka.errors import CommitFailedError, IllegalStateError, KafkaError
from aiokafka.structs import ConsumerRecord, RecordMetadata
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from daemon import metrics
from daemon.capabilities import available_methods, unsupported_reason
from daemon.child import WarmChildren
from daemon.control import ControlReader
from daemon.http_server import HttpEndpoint
from daemon.job import JobRunner, child_environment
from daemon.kafka_options import kafka_options
from daemon.policy import policy_errors
from daemon.publisher import ATTEMPT_HEADER, Outgoing, Publisher
from daemon.settings import Settings
from daemon.slots import Slots, discover_gpus
from daemon.systemd import Notifier
from daemon.topics import partition_numbers
from schemas import (
    Accepted,
    Cancel,
    Cancelled,
    Failed,
    FieldError,
    Rejected,
    Rejection,
    RequestBase,
    Retrying,
    decode_request,
)

log = structlog.get_logger()


ASSIGNORS = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor, "sticky": StickyPartitionAssignor}
# The Kafka loop counts as stuck (unhealthy) when it has not turned for this long.
STUCK_AFTER_S = 30.0
LAG_INTERVAL_S = 5.0


@dataclass
class RunningJob:
    request_id: str
    offset: int
    runner: JobRunner
    slots: list[str]
    task: asyncio.Task[None]


class Service:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.publisher = Publisher(settings)
        self.consumer = AIOKafkaConsumer(
            **kafka_options(settings),
            group_id=settings.group_id,
            client_id=f"adapterd-{settings.host}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_interval_ms=settings.max_poll_interval_ms,
            session_timeout_ms=settings.session_timeout_ms,
            group_instance_id=settings.group_instance_id,
            partition_assignment_strategy=(ASSIGNORS[settings.partition_assignment],),
        )
        self.slots = Slots(discover_gpus(settings.gpus), settings.job_slots)
        self.children = WarmChildren(child_environment(settings), settings.work_dir / "children.log", enabled=settings.warm_child)
        self.control = ControlReader(settings, self._cancel)
        self.notifier = Notifier()
        self.http: HttpEndpoint | None = None
        self.jobs: dict[TopicPartition, RunningJob] = {}
        self.cancelled: dict[str, str] = {}  # request id → reason, from the control topic
        self._settling: dict[TopicPartition, asyncio.Task[None]] = {}
        self.stop_requested = asyncio.Event()
        self.ready = asyncio.Event()
        self.last_turn = time.monotonic()
        self._lag_measured = 0.0

    def request_stop(self) -> None:
        log.info("daemon.stopping", running_jobs=len(self.jobs))
        self.notifier.stopping(f"stopping; {len(self.jobs)} job(s) saving a checkpoint")
        if self.jobs:
            self.notifier.extend_stop(self.settings.drain_timeout_s + 30)
        self.stop_requested.set()

    async def run(self) -> None:
        metrics.SLOTS.set(self.slots.total)
        if self.settings.metrics_address:
            self.http = HttpEndpoint(self.settings.metrics_address, self.health, self.status).start()
        await self.publisher.start()
        await self._prepare_children()
        try:
            await self.control.start(await partition_numbers(self.settings, self.settings.control_topic))
            self.consumer.subscribe([self.settings.requests_topic], listener=_Rebalance(self))
            await self.consumer.start()
            log.info(
                "daemon.started", topic=self.settings.requests_topic, group_id=self.settings.group_id,
                gpus=self.slots.gpus, slots=self.slots.total, methods=available_methods(),
            )
            try:
                await self._poll_until_stopped()
            finally:
                await self._settled()
                await self._stop_jobs()
                await self.consumer.stop()
        finally:
            await self.control.stop()
            await self.children.close()
            await self.publisher.stop()
            if self.http is not None:
                self.http.stop()
            log.info("daemon.stopped")

    async def _poll_until_stopped(self) -> None:
        while not self.stop_requested.is_set():
            batches = await self.consumer.getmany(timeout_ms=500, max_records=2000)
            self.last_turn = time.monotonic()
            self.notifier.feed_watchdog()
            for tp, records in batches.items():
                await self._take_batch(tp, records)
            await self._measure_lag()

    async def _measure_lag(self) -> None:
        """Consumer lag per partition, from the brokers' end offsets (a paused partition fetches nothing,
        so its high watermark would go stale while its job runs)."""
        if self.last_turn - self._lag_measured < LAG_INTERVAL_S or not self.consumer.assignment():
            return
        self._lag_measured = self.last_turn
        assigned = list(self.consumer.assignment())
        ends = await self.consumer.end_offsets(assigned)
        for tp in assigned:
            job = self.jobs.get(tp)
            # A running job's request still counts: its offset is not committed until it ends.
            next_offset = job.offset if job is not None else await self.consumer.position(tp)
            metrics.CONSUMER_LAG.labels(str(tp.partition)).set(max(0, ends[tp] - next_offset))

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy once the consumer has joined its group, while the Kafka loop keeps turning."""
        since_turn = time.monotonic() - self.last_turn
        healthy = self.ready.is_set() and since_turn < STUCK_AFTER_S and not self.stop_requested.is_set()
        return healthy, {
            "healthy": healthy, "joined_group": self.ready.is_set(), "stopping": self.stop_requested.is_set(),
            "seconds_since_poll": round(since_turn, 3),
        }

    def status(self) -> dict[str, Any]:
        """What this host is running: for `adapterd status` and operators."""
        return {
            "host": self.settings.host,
            "group_id": self.settings.group_id,
            "gpus": self.slots.gpus,
            "slots": {"total": self.slots.total, "busy": self.slots.busy, "free": self.slots.free},
            "jobs": [
                {**job.runner.status(), "partition": tp.partition, "offset": job.offset}
                for tp, job in list(self.jobs.items())
            ],
        }

    async def _take_batch(self, tp: TopicPartition, records: list[ConsumerRecord[bytes, bytes]]) -> None:
        """Handle one partition's records in order. Rejections are pipelined: their DLQ records and
        events go out in batches and are settled (acknowledged, then committed) in the background,
        in order; a valid request waits for the rejections before it to be settled."""
        outgoing: list[Outgoing] = []
        last_rejected: int | None = None
        for record in records:
            if tp in self.jobs:
                break  # stale records of a paused partition; it is read again from its job's next offset
            decoded = decode_request(record.value, record.key)
            rejection = decoded if isinstance(decoded, Rejection) else self._refusal(decoded)
            if rejection is not None:
                outgoing += self._rejection_messages(record, rejection)
                last_rejected = record.offset
                continue
            assert not isinstance(decoded, Rejection)
            await self._flush(tp, outgoing, last_rejected)
            outgoing, last_rejected = [], None
            await self._settled(tp)
            if decoded.request_id in self.cancelled:
                await self._skip_cancelled(tp, record, decoded)
                continue
            if not await self._start_job(tp, record, decoded):
                break  # no free slot: the request stays in Kafka, and so does the rest of this batch
        await self._flush(tp, outgoing, last_rejected)

    def _refusal(self, request: RequestBase) -> Rejection | None:
        """A valid request this host will not run: a method its TRL lacks, or one outside policy."""
        unsupported = unsupported_reason(request.method)
        if unsupported:
            return Rejection("unsupported_method", [FieldError(path="method", message=unsupported)], request.request_id)
        if request.resources.gpus > self.slots.most_per_job():
            host = f"this host has {len(self.slots.gpus)} GPU(s)" if self.slots.gpus else "this host has no GPU (it runs one-GPU requests on the CPU)"
            return Rejection("resources", [FieldError(path="resources.gpus", message=f"asks for {request.resources.gpus} GPUs; {host}")], request.request_id)
        errors = policy_errors(request, self.settings)
        return Rejection("policy", errors, request.request_id) if errors else None

    def _rejection_messages(self, record: ConsumerRecord[bytes, bytes], rejection: Rejection) -> list[Outgoing]:
        metrics.REJECTED.labels(rejection.reason).inc()
        log.warning("request.rejected", request_id=rejection.request_id, reason=rejection.reason,
                    errors=rejection.errors, offset=record.offset)
        rejected = Rejected(request_id=rejection.request_id, host=self.settings.host, reason=rejection.reason, errors=rejection.errors)
        return [self.publisher.dead_letter(record, rejection), self.publisher.event(rejected)]

    async def _flush(self, tp: TopicPartition, messages: list[Outgoing], last_offset: int | None) -> None:
        if last_offset is not None:
            self._settle_later(tp, await self.publisher.send_all(messages), last_offset)

    def _settle_later(self, tp: TopicPartition, acks: list[asyncio.Future[RecordMetadata]], last_offset: int) -> None:
        """Commit past `last_offset` once every ack has come and the partition's earlier settles are done."""
        previous = self._settling.get(tp)

        async def settle() -> None:
            if previous is not None:
                await previous
            try:
                await asyncio.gather(*acks)
            except Exception as exc:
                # Not committed: the rejected messages are read again after a restart; nothing is lost.
                log.error("rejections.unacknowledged", partition=tp.partition, offset=last_offset, error=repr(exc))
                return
            await self._commit(tp, last_offset + 1)

        self._settling[tp] = asyncio.create_task(settle())

    async def _settled(self, tp: TopicPartition | None = None) -> None:
        """Wait for the partition's settles (every partition's when None)."""
        if tp is None:
            await asyncio.gather(*self._settling.values())
        elif tp in self._settling:
            await self._settling[tp]

    async def _skip_cancelled(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes], request: RequestBase) -> None:
        """A request cancelled before it started: its terminal event, then its offset; no training."""
        reason = self.cancelled[request.request_id]
        log.info("request.skipped_cancelled", request_id=request.request_id, reason=reason, offset=record.offset)
        await self.publisher.publish(Cancelled(request_id=request.request_id, host=self.settings.host, metadata=request.metadata, reason=reason))
        metrics.JOBS.labels("cancelled").inc()
        await self._commit(tp, record.offset + 1)

    async def _start_job(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes], request: RequestBase) -> bool:
        """Start the request's job beside the loop. False when not enough slots are free."""
        slots = self.slots.take(request.resources.gpus)
        if slots is None:
            self.consumer.seek(tp, record.offset)
            self.consumer.pause(tp)  # until a job ends and frees its slots
            if not self.slots.free:
                self._pause_idle_partitions()
            return False
        metrics.SLOTS_BUSY.set(self.slots.busy)
        if request.experimental:
            log.warning("job.experimental_method", request_id=request.request_id, method=request.method)
        self.consumer.pause(tp)
        self.consumer.seek(tp, record.offset + 1)
        await self.publisher.publish(Accepted(
            request_id=request.request_id, host=self.settings.host, metadata=request.metadata, method=request.method,
        ))
        runner = JobRunner(
            request, self.settings, self.publisher, self.children, received_at=record.timestamp / 1000,
            slot=self.slots.label(slots), visible_devices=self.slots.visible_devices(slots), attempt=_attempt(record),
        )
        task = asyncio.create_task(self._run_job(tp, record, runner), name=f"job-{request.request_id}")
        self.jobs[tp] = RunningJob(request.request_id, record.offset, runner, slots, task)
        if not self.slots.free:
            self._pause_idle_partitions()
        self._report_status()
        return True

    async def _run_job(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes], runner: JobRunner) -> None:
        offset = record.offset
        try:
            event = await runner.run()
            if isinstance(event, Retrying):
                # Back to the end of its partition, so the requests behind it are not held up.
                await self.publisher.deliver(self.publisher.retry(record, runner.attempt + 1))
            elif isinstance(event, Failed) and event.retryable:
                log.warning("job.attempts_exhausted", request_id=runner.request.request_id, attempts=runner.attempt)
                await self.publisher.deliver(self.publisher.failed_letter(record, event))
            await self._commit(tp, offset + 1)
        except asyncio.CancelledError:
            log.warning("job.interrupted", request_id=runner.request.request_id, committed=False)
            raise
        except Exception:
            # A fault outside the job itself (the broker refused the event): leave the request uncommitted
            # and read it again, rather than lose it.
            log.exception("job.error", request_id=runner.request.request_id)
            if tp in self.consumer.assignment():
                self.consumer.seek(tp, offset)
        finally:
            job = self.jobs.get(tp)
            if job is not None and job.offset == offset:
                del self.jobs[tp]
                self.slots.give_back(job.slots)
                metrics.SLOTS_BUSY.set(self.slots.busy)
            if not self.stop_requested.is_set():
                self._resume_idle_partitions()
                await self._prepare_children()
                self._report_status()

    async def _prepare_children(self) -> None:
        """A warm child for each free slot, its devices set, so the next one-GPU job starts at once."""
        await self.children.prepare([self.slots.visible_devices([slot]) for slot in self.slots.free])

    def _report_status(self) -> None:
        status = f"{len(self.jobs)} job(s) running; {len(self.slots.free)} of {self.slots.total} slot(s) free"
        if self.ready.is_set():
            self.notifier.status(status)

    async def _cancel(self, cancel: Cancel) -> None:
        """From the control topic: stop the request's running job, or remember to skip it."""
        self.cancelled[cancel.request_id] = cancel.reason or "cancelled"
        for job in list(self.jobs.values()):
            if job.request_id == cancel.request_id:
                if job.runner.cancel(self.cancelled[cancel.request_id]):
                    job.task.cancel()
                else:
                    log.warning("cancel.too_late", request_id=cancel.request_id, stage=job.runner.stage)

    async def _commit(self, tp: TopicPartition, offset: int) -> None:
        """Commit, retrying while the brokers are away; not once the partition has moved."""
        try:
            async for attempt in AsyncRetrying(
                retry=retry_if_exception(lambda exc: isinstance(exc, KafkaError) and not isinstance(exc, CommitFailedError | IllegalStateError)),
                wait=wait_exponential(multiplier=0.5, max=10),
                stop=stop_after_delay(300),
                reraise=True,
                before_sleep=lambda state: log.warning("offset.commit_retry", partition=tp.partition, offset=offset, attempt=state.attempt_number),
            ):
                with attempt:
                    await self.consumer.commit({tp: offset})
        except (CommitFailedError, IllegalStateError) as exc:
            # The partition moved to another member; that member reads the request again.
            log.warning("offset.commit_failed", partition=tp.partition, offset=offset, error=str(exc))

    def _pause_idle_partitions(self) -> None:
        idle = [tp for tp in self.consumer.assignment() if tp not in self.jobs]
        self.consumer.pause(*idle)

    def _resume_idle_partitions(self) -> None:
        if not self.slots.free:
            return
        idle = [tp for tp in self.consumer.assignment() if tp not in self.jobs]
        self.consumer.resume(*idle)

    async def _stop_jobs(self) -> None:
        """Stop running jobs without committing them: each saves a checkpoint (within `drain_timeout_s`)
        and its request is read again after a restart, resuming there."""
        for job in self.jobs.values():
            if job.runner.ended:
                continue  # its outcome is published; let it commit rather than have it redelivered
            job.runner.stop_at_checkpoint(self.settings.drain_timeout_s)
            job.task.cancel()
        await asyncio.gather(*(job.task for job in self.jobs.values()), return_exceptions=True)


def _attempt(record: ConsumerRecord[bytes, bytes]) -> int:
    """Which try of its request this record is: 1, or what the header of a retry says."""
    value = dict(record.headers or ()).get(ATTEMPT_HEADER, b"1")
    return int(value) if value.isdigit() and int(value) >= 1 else 1


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    """Keep running jobs' partitions paused across a rebalance, and stop jobs whose partition moved away."""

    def __init__(self, service: Service) -> None:
        self.service = service

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        log.info("partitions.revoked", partitions=sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        service = self.service
        log.info("partitions.assigned", partitions=sorted(tp.partition for tp in assigned))
        for tp, job in list(service.jobs.items()):
            if tp in assigned:
                # New assignments start unpaused at the committed offset, which is this job's request.
                service.consumer.pause(tp)
                service.consumer.seek(tp, job.offset + 1)
            else:
                log.warning("job.partition_moved", request_id=job.request_id, partition=tp.partition)
                job.runner.stop_at_checkpoint(service.settings.drain_timeout_s)
                job.task.cancel()
        if not service.slots.free:
            service._pause_idle_partitions()
        if not service.ready.is_set():
            service.ready.set()
            service.notifier.ready(f"joined group {service.settings.group_id}; {service.slots.total} slot(s)")
