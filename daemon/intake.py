"""Intake: every record of the requests topic becomes a valid request for the scheduler, or a
rejection — a `rejected` event naming each bad field, and the record's bytes in the DLQ.

A record is rejected when it does not decode or validate, carries a credential, or is too large for the
daemon's copies of it (daemon/decoding.py: the fleet's readers decode it the same way), is not
written by a key of the team it names or names a class that team may not use (daemon/admission/grants.py), names a
method this host's TRL cannot run, asks for more GPUs than the host has, or breaks the operator's
policy; and, once its memory estimate is worked out, when its job fits none of the host's GPUs,
whole or sharded (daemon/resources/shards.py; the scheduler's offer raises `Unfit`). Rejections are
pipelined: their DLQ records and events go out in batches and are settled (acknowledged, then committed) in the
background, in order; a valid request waits until the rejections before it are settled, so offsets are committed in
order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import structlog
from aiokafka import TopicPartition

from daemon import decoding, executors
from daemon.admission.grants import Grants
from daemon.admission.images import has_inline_images
from daemon.admission.judge import image_refusal, refusal_before_images
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Outgoing, Publisher
from daemon.kafka.queue_seal import QueueSeal, claim_refusal
from daemon.kafka.records import Record
from daemon.kafka.trace import trace_context
from daemon.kafka.unreadable import UnreadableRecord, rejection_of
from daemon.ops import metrics
from daemon.resources.shards import Unfit
from daemon.resources.slots import Slots
from daemon.settings import Settings
from schemas import FieldError, Rejected, Rejection, RequestBase

log = structlog.get_logger()

# The longest judging a request's inline images may take (`judge.image_refusal`, their headers read in a thread)
# may take; well inside systemd's WatchdogSec (120) and the loop's STUCK_AFTER_S (30), which the
# service loop's turns feed.
JUDGE_DEADLINE_S = 20.0
# How long intake decides records without giving the loop a turn: far inside aiokafka's heartbeat
# (3 s) and the watchdog's STUCK_AFTER_S. A turn for every record cost the rejection path a third of
# its rate end to end (benchmarks.intake: 3,400 against 5,100/s, 9,600 against 10,400/s, alternating; issue 52).
TURN_EVERY_S = 0.005


async def judged(request: RequestBase, settings: Settings, slots: Slots) -> Rejection | None:
    """`judge.refusal` as intake makes it: its checks that read no image on the loop (microseconds:
    a thread's hop cost more than the work, benchmarks/reject_path.py, a refused request: 274 against
    114 us on a loaded 2-core host, issue 51), then, for a request they let through that has inline
    images, `judged_images`. A refused request's images are never read."""
    rejection, images = judged_on_loop(request, settings, slots)
    return await judged_images(request, settings) if images else rejection


def judged_on_loop(request: RequestBase, settings: Settings, slots: Slots) -> tuple[Rejection | None, bool]:
    """`judged`'s part on the loop, without a coroutine (`Intake.take` calls it for each request): the
    refusal of its checks that read no image, and whether its images are left to read (`judged_images`)."""
    rejection = refusal_before_images(request, settings, slots)
    return rejection, rejection is None and has_inline_images(request)


async def judged_images(request: RequestBase, settings: Settings) -> Rejection | None:
    """`judge.image_refusal` in a thread of the `admission` pool (daemon/executors.py): it reads the
    images' headers in time linear in their bytes, so the loop keeps turning beside it (heartbeats,
    the publisher's acknowledgements, the HTTP endpoint). Bounded by JUDGE_DEADLINE_S: past it the
    request is refused, naming its rows, and the service loop turns on (the systemd watchdog is fed
    by its turns)."""
    try:
        async with asyncio.timeout(JUDGE_DEADLINE_S):
            return await executors.run("admission", image_refusal, request, settings)
    except TimeoutError:
        message = f"its images took longer than {JUDGE_DEADLINE_S:g} s to check; send fewer or smaller images"
        return Rejection("invalid", [FieldError(path="dataset.rows", message=message)], request.request_id)


def internal_rejection(record: Record, exc: Exception, request_id: str | None = None) -> Rejection:
    """What a record becomes when deciding about it raised: rejected (reason `internal`), the
    exception's class in the DLQ, the traceback in the log, and counted."""
    log.exception("intake.internal_error", offset=record.offset, partition=record.partition, error=type(exc).__name__)
    metrics.INTAKE_ERRORS.labels(type(exc).__name__).inc()
    message = (
        f"adapterd failed to decide about this request ({type(exc).__name__}); the record is in the "
        "DLQ and the daemon's log says why"
    )
    return Rejection("internal", [FieldError(path="", message=message)], request_id, type(exc).__name__)


class Intake:
    def __init__(
        self, settings: Settings, publisher: Publisher, partitions: Partitions, scheduler: Scheduler, slots: Slots
    ) -> None:
        self.settings = settings
        self.publisher = publisher
        self.partitions = partitions
        self.scheduler = scheduler
        self.slots = slots
        # With priority classes the daemon runs the claims topic: only a claim the fleet signed runs (issue 61).
        self.seal = QueueSeal.from_settings(settings) if settings.class_topics else None
        self.grants = Grants.from_settings(settings.teams)  # the dispatcher's heads are judged by it too
        decoding.scanner()  # the credential rules built now, not at the first record's decode on the loop

    def grant_refusal(self, record: Record, request: RequestBase) -> Rejection | None:
        """`Grants.refusal` of a decoded record, in the class it runs as (None in open mode:
        every valid record passes)."""
        return self.grants.refusal(
            request, record.value, record.headers, self.settings.runs_as(record.headers, request.priority_class)
        )

    async def take(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        """Handle one partition's fetched records in order, until the scheduler holds the partition."""
        outgoing: list[Outgoing] = []
        last_rejected: int | None = None
        loop = asyncio.get_running_loop()
        turn_at = loop.time()
        turned = True  # whether other work may have run since the partition was last looked at
        logger = log.bind()  # what each of the proxy's calls would bind: once a batch
        for record in records:
            # The loop's turn between records, at least every TURN_EVERY_S: a batch of records decided
            # without one (a small record is decided on the loop, and a rejection awaits nothing until
            # the flush) would hold heartbeats and the watchdog for the whole batch.
            if loop.time() >= turn_at:
                await asyncio.sleep(0)
                turn_at = loop.time() + TURN_EVERY_S
                turned = True
            # Only a turn (a rebalance's callback, a job ending) or this batch's own awaits move the
            # partition or make the scheduler hold it: looked at after each, not at every record
            # decided on the loop (the consumer's assignment is a set built a call).
            if turned:
                if tp not in self.partitions.assigned():
                    break  # it moved to another member during a turn: the records are that member's now
                if self.scheduler.holds(tp):
                    break  # stale records of a held partition: it is read again from where it was held
                turned = False
            rejection: Rejection | None
            try:
                # A claim the fleet did not write is refused whatever it holds: its signature checked first.
                unclaimed, waited = None, False
                if self.seal is not None and record.topic == self.settings.claims_topic:
                    unclaimed, waited = await decoding.checked(record, claim_refusal, self.seal, record)
                turned = turned or waited
                # `decoding.decoded` and `judged`, their coroutines awaited only for work off the loop.
                decoded = decoding.decoded_on_loop(record, self.settings.max_message_bytes)
                if decoded is None:
                    decoded, turned = await decoding.decoded(record, self.settings.max_message_bytes), True
                if unclaimed is not None:
                    rejection = Rejection(
                        "unverified_claim", [FieldError(path="", message=unclaimed)], decoded.request_id
                    )
                elif isinstance(decoded, Rejection):
                    rejection = decoded
                else:
                    # Who wrote it first: a request its team did not sign is refused before anything it asks is judged.
                    rejection, waited = (
                        await decoding.checked(record, self.grant_refusal, record, decoded)
                        if self.grants.bound
                        else (None, False)
                    )
                    turned = turned or waited
                    if rejection is None:
                        rejection, images = judged_on_loop(decoded, self.settings, self.slots)
                        if images:
                            rejection, turned = await judged_images(decoded, self.settings), True
            except Exception as exc:  # a bug of ours, met by this record: rejected, never a crash or a re-read
                decoded, rejection, turned = None, internal_rejection(record, exc), True
            if rejection is not None:
                outgoing += self.rejection_messages(record, rejection, logger)
                last_rejected = record.offset
                continue
            assert decoded is not None and not isinstance(decoded, Rejection)  # else rejection is set
            turned = True  # the flush, the settling and the offer await
            await self._flush(tp, outgoing, last_rejected)
            outgoing, last_rejected = [], None
            await self.partitions.settled(tp)
            try:
                offered = await self.scheduler.offer(tp, record, decoded)
            except Exception as exc:  # as above: rejected, unless the offer got as far as starting its job
                # A job that fits none of this host's GPUs (daemon/resources/shards.py) is rejected with its numbers.
                rejection = (
                    exc.rejection if isinstance(exc, Unfit) else internal_rejection(record, exc, decoded.request_id)
                )
                if self.scheduler.let_go(tp, record.offset + 1):
                    outgoing += self.rejection_messages(record, rejection)
                    last_rejected = record.offset
                break  # the partition is read again past this record
            if not offered.next_record:
                break  # the rest of this batch is read again when the partition resumes
        await self._flush(tp, outgoing, last_rejected)

    async def reject_unreadable(self, record: UnreadableRecord, exc: BaseException) -> None:
        """A record the Kafka client could not read, known by its offset (daemon/kafka/unreadable.py):
        dead-lettered without value, announced, and committed past, in order with the partition's other settles."""
        tp = TopicPartition(record.topic, record.partition)
        await self._flush(tp, self.rejection_messages(record, rejection_of(record, exc)), record.offset)

    def rejection_messages(self, record: Record, rejection: Rejection, logger: Any = log) -> list[Outgoing]:
        """The DLQ record and the `rejected` event of one rejection; never raises (an error in
        building them is rejected as `internal` in their place). `logger`: `log` bound once for a
        batch (`take`): each of structlog's lazy proxy's calls binds it again (0.7 us a rejection)."""
        try:
            return self._rejection_messages(record, rejection.bounded(), logger)
        except Exception as exc:
            return self._rejection_messages(record, internal_rejection(record, exc), logger)

    def _rejection_messages(self, record: Record, rejection: Rejection, logger: Any) -> list[Outgoing]:
        rejected = Rejected(
            request_id=rejection.request_id, host=self.settings.host, reason=rejection.reason, errors=rejection.errors
        )
        trace = trace_context(record)  # the letter's and the event's, read once
        messages = [
            self.publisher.rejection_letter(record, rejection, trace),
            self.publisher.event_message(rejected, trace),
        ]
        metrics.rejected(rejection.reason).inc()
        logger.warning(
            "request.rejected",
            request_id=rejection.request_id,
            reason=rejection.reason,
            errors=rejection.errors,
            offset=record.offset,
        )
        return messages

    async def _flush(self, tp: TopicPartition, messages: list[Outgoing], last_offset: int | None) -> None:
        if last_offset is not None:
            self.partitions.settle_later(tp, await self.publisher.send_all(messages), last_offset)
