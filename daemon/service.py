"""The Kafka loop: consume requests, reject what is invalid, run the rest beside the loop.

Delivery rules (see shared DESIGN.md):
- An offset is committed only after the request's terminal event is acknowledged by the broker.
- One job per partition: the partition is paused while its job runs, and the loop keeps polling,
  so heartbeats and `max_poll_interval_ms` stay satisfied through long jobs.
- At most `job_slots` jobs at once; beyond that, requests stay in Kafka (partitions paused).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError
from aiokafka.structs import ConsumerRecord, RecordMetadata

from daemon.capabilities import available_methods, unsupported_reason
from daemon.child import WarmChildren
from daemon.job import JobRunner, child_environment
from daemon.policy import policy_errors
from daemon.publisher import Outgoing, Publisher
from daemon.settings import Settings
from schemas import (
    Accepted,
    FieldError,
    Rejected,
    Rejection,
    RequestBase,
    decode_request,
)

log = structlog.get_logger()


@dataclass
class RunningJob:
    request_id: str
    offset: int
    task: asyncio.Task[None]


class Service:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.publisher = Publisher(settings)
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap_servers,
            group_id=settings.group_id,
            client_id=f"adapterd-{settings.host}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            max_poll_interval_ms=settings.max_poll_interval_ms,
            session_timeout_ms=settings.session_timeout_ms,
        )
        self.children = WarmChildren(child_environment(settings), settings.work_dir / "children.log", enabled=settings.warm_child)
        self.jobs: dict[TopicPartition, RunningJob] = {}
        self._settling: dict[TopicPartition, asyncio.Task[None]] = {}
        self.stop_requested = asyncio.Event()
        self.ready = asyncio.Event()

    def request_stop(self) -> None:
        log.info("daemon.stopping", running_jobs=len(self.jobs))
        self.stop_requested.set()

    async def run(self) -> None:
        await self.publisher.start()
        await self.children.prepare()
        try:
            self.consumer.subscribe([self.settings.requests_topic], listener=_Rebalance(self))
            await self.consumer.start()
            log.info("daemon.started", topic=self.settings.requests_topic, group_id=self.settings.group_id, job_slots=self.settings.job_slots, methods=available_methods())
            try:
                await self._poll_until_stopped()
            finally:
                await self._settled()
                await self._stop_jobs()
                await self.consumer.stop()
        finally:
            await self.children.close()
            await self.publisher.stop()
            log.info("daemon.stopped")

    async def _poll_until_stopped(self) -> None:
        while not self.stop_requested.is_set():
            batches = await self.consumer.getmany(timeout_ms=500, max_records=2000)
            for tp, records in batches.items():
                await self._take_batch(tp, records)

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
            if not await self._start_job(tp, record, decoded):
                break  # no free slot: the request stays in Kafka, and so does the rest of this batch
        await self._flush(tp, outgoing, last_rejected)

    def _refusal(self, request: RequestBase) -> Rejection | None:
        """A valid request this host will not run: a method its TRL lacks, or one outside policy."""
        unsupported = unsupported_reason(request.method)
        if unsupported:
            return Rejection("unsupported_method", [FieldError(path="method", message=unsupported)], request.request_id)
        errors = policy_errors(request, self.settings)
        return Rejection("policy", errors, request.request_id) if errors else None

    def _rejection_messages(self, record: ConsumerRecord[bytes, bytes], rejection: Rejection) -> list[Outgoing]:
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

    async def _start_job(self, tp: TopicPartition, record: ConsumerRecord[bytes, bytes], request: RequestBase) -> bool:
        """Start the request's job beside the loop. False when no slot is free."""
        if len(self.jobs) >= self.settings.job_slots:
            self.consumer.seek(tp, record.offset)
            self._pause_idle_partitions()
            return False
        if request.experimental:
            log.warning("job.experimental_method", request_id=request.request_id, method=request.method)
        self.consumer.pause(tp)
        self.consumer.seek(tp, record.offset + 1)
        await self.publisher.publish(Accepted(
            request_id=request.request_id, host=self.settings.host, metadata=request.metadata, method=request.method,
        ))
        runner = JobRunner(request, self.settings, self.publisher, self.children, received_at=record.timestamp / 1000)
        task = asyncio.create_task(self._run_job(tp, record.offset, runner), name=f"job-{request.request_id}")
        self.jobs[tp] = RunningJob(request.request_id, record.offset, task)
        if len(self.jobs) >= self.settings.job_slots:
            self._pause_idle_partitions()
        return True

    async def _run_job(self, tp: TopicPartition, offset: int, runner: JobRunner) -> None:
        try:
            await runner.run()
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
            if self.jobs.get(tp) is not None and self.jobs[tp].offset == offset:
                del self.jobs[tp]
            if not self.stop_requested.is_set():
                self._resume_idle_partitions()
                await self.children.prepare()

    async def _commit(self, tp: TopicPartition, offset: int) -> None:
        try:
            await self.consumer.commit({tp: offset})
        except (CommitFailedError, IllegalStateError) as exc:
            # The partition moved to another member; that member reads the request again.
            log.warning("offset.commit_failed", partition=tp.partition, offset=offset, error=str(exc))

    def _pause_idle_partitions(self) -> None:
        idle = [tp for tp in self.consumer.assignment() if tp not in self.jobs]
        self.consumer.pause(*idle)

    def _resume_idle_partitions(self) -> None:
        if len(self.jobs) >= self.settings.job_slots:
            return
        idle = [tp for tp in self.consumer.assignment() if tp not in self.jobs]
        self.consumer.resume(*idle)

    async def _stop_jobs(self) -> None:
        """Stop running jobs without committing them: their requests are read again after a restart."""
        tasks = [job.task for job in self.jobs.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


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
                job.task.cancel()
        if len(service.jobs) >= service.settings.job_slots:
            service._pause_idle_partitions()
        service.ready.set()
