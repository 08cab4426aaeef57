"""Publish lifecycle events and dead letters through one idempotent producer with acks=all.

The messages are built by the nouns (`event_message`, `rejection_letter`, `failed_letter`,
`retry_copy`, `deferred_copy`) and sent by the verbs (`deliver`, `publish`, `send_all`).
`publish` returns once the broker has the event. `send_all` queues many messages in as few
batches as their partitions need (the intake path rejects thousands a second) and returns the
futures of their acknowledgements; order is kept per partition.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from aiokafka.errors import KafkaError, KafkaTimeoutError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import RecordMetadata
from tenacity import AsyncRetrying, retry_if_exception, wait_exponential

from daemon.kafka.clients import Producer, kafka_producer
from daemon.kafka.copies import dlq_value, errors_header, producer_signature
from daemon.kafka.records import Record
from daemon.kafka.trace import Headers, trace_context
from daemon.settings import Settings
from daemon.settings.secret_files import event_signer
from schemas import FieldError, Rejection
from schemas.events import EventBase, Failed
from schemas.signing import SIGNATURE_HEADER

log = structlog.get_logger()


@dataclass(frozen=True)
class Outgoing:
    topic: str
    key: bytes | None
    value: bytes
    headers: Headers


class Publisher:
    """Events and dead letters, through `producer` (aiokafka's, unless a test gives its own)."""

    def __init__(
        self,
        settings: Settings,
        producer: Producer | None = None,
        partitioner: Callable[[bytes | None, list[int], list[int]], int] | None = None,
        *,
        watchers: Sequence[Callable[[EventBase], None]] = (),
    ) -> None:
        self.settings = settings
        self.producer = producer if producer is not None else kafka_producer(settings)
        self.partitioner = partitioner if partitioner is not None else DefaultPartitioner()
        self.signer = event_signer(settings)
        # Called with each event `publish` is about to send: the fleet's view counts this host's own ends at once,
        # before it reads them back (daemon/fleet/view.py, `FleetView.sending`).
        self.watchers = tuple(watchers)

    async def start(self) -> None:
        await self.producer.start()

    async def stop(self) -> None:
        await self.producer.stop()

    def event_message(self, event: EventBase, trace: Headers | None = None) -> Outgoing:
        """An event, with its request's trace context (daemon/kafka/trace.py) when the request had one,
        and with the host's signing key the fleet's signature over exactly the bytes sent
        (schemas/signing.py); a repeat of the message sends the same bytes and signature."""
        value = event.model_dump_json().encode()
        signature: Headers = [(SIGNATURE_HEADER, self.signer.sign(value))] if self.signer is not None else []
        return Outgoing(
            self.settings.events_topic,
            event.request_id.encode() if event.request_id else None,
            value,
            [
                ("adapterd-event-type", event.type.encode()),
                ("adapterd-schema-version", b"1"),
                *signature,
                *(trace or []),
            ],
        )

    def rejection_letter(self, record: Record, rejection: Rejection, trace: Headers | None = None) -> Outgoing:
        """The raw bytes of a message that could not become a job, with why and where it came from
        (`trace`: the record's trace context, when the caller has read it for the event too)."""
        return self._letter(record, rejection.reason, rejection.exception, errors_header(rejection.errors), trace=trace)

    def failed_letter(
        self, record: Record, failed: Failed, *, reason: str = "attempts_exhausted", exception: str | None = None
    ) -> Outgoing:
        """The bytes of a request whose every attempt failed (or that kept failing outside its job), for the DLQ."""
        errors = errors_header([FieldError(path="", message=f"{failed.code} in {failed.stage}: {failed.message}")])
        return self._letter(record, reason, exception, errors, [("adapterd-attempts", str(failed.attempt).encode())])

    def _letter(
        self,
        record: Record,
        reason: str,
        exception: str | None,
        errors: bytes,
        extra: Headers | None = None,
        trace: Headers | None = None,
    ) -> Outgoing:
        """A DLQ record: the request's bytes (or as much as fits), why, and where it came from."""
        value, omitted = dlq_value(record, self.settings.max_message_bytes)
        headers = [
            ("adapterd-reason", reason.encode()),
            *([("adapterd-exception", exception.encode())] if exception else []),
            ("adapterd-errors", errors),
            *(extra or []),
            *omitted,
            *self._source(record, trace),
        ]
        return Outgoing(self.settings.dlq_topic, record.key, value, headers)

    def _source(self, record: Record, trace: Headers | None = None) -> Headers:
        """Where a dead letter came from, which host sent it there, and the trace it belongs to."""
        return [
            *(trace_context(record) if trace is None else trace),
            ("adapterd-source-topic", record.topic.encode()),
            ("adapterd-source-partition", str(record.partition).encode()),
            ("adapterd-source-offset", str(record.offset).encode()),
            ("adapterd-host", self.settings.host.encode()),
        ]

    def retry_copy(self, record: Record, retry_headers: Headers) -> Outgoing:
        """The request again, byte for byte and with the same key, for its next attempt: its signed
        retry state (daemon/kafka/retry_state.py), its producer's signature and its trace context as headers."""
        return Outgoing(
            self.settings.requests_topic,
            record.key,
            record.value or b"",
            [*retry_headers, *producer_signature(record), *trace_context(record)],
        )

    def deferred_copy(self, record: Record) -> Outgoing:
        """A retry that is not yet due, to the end of its partition again, headers and all (but a
        header with a null value: the daemon's own are never null, and the rest are the producer's)."""
        headers = [(name, value) for name, value in record.headers or () if value is not None]
        return Outgoing(self.settings.requests_topic, record.key, record.value or b"", headers)

    async def deliver(self, message: Outgoing) -> None:
        """Send one message and wait until the broker has it, however long the brokers are away.
        After a failure the same bytes are sent again (for an event, the same event_id, so a
        consumer can drop a repeat)."""
        async for attempt in AsyncRetrying(
            retry=retry_if_exception(_brokers_away),
            wait=wait_exponential(multiplier=0.5, max=10),
            before_sleep=lambda state: log.warning(
                "message.send_retry",
                topic=message.topic,
                key=(message.key or b"").decode(errors="replace"),
                attempt=state.attempt_number,
                error=repr(state.outcome.exception()) if state.outcome else None,
            ),
        ):
            with attempt:
                [ack] = await self.send_all([message])
                await ack

    async def publish(self, event: EventBase, trace: Headers | None = None) -> None:
        """Publish one event (with its request's trace headers) and wait until the broker has it.
        While the brokers are away the job goes on, and its later events wait behind this one."""
        for watcher in self.watchers:
            watcher(event)
        await self.deliver(self.event_message(event, trace))
        log.info("event.published", type=event.type, request_id=event.request_id)

    async def send_all(self, messages: list[Outgoing]) -> list[asyncio.Future[RecordMetadata]]:
        """Queue messages partition by partition (by key, as Kafka's default partitioner does)."""
        groups: dict[tuple[str, int], list[Outgoing]] = {}
        choices = PartitionChoices(self.partitioner)
        for message in messages:
            if message.topic not in choices:
                choices.add(message.topic, await self.producer.partitions_for(message.topic))
            groups.setdefault((message.topic, choices.choose(message.topic, message.key)), []).append(message)
        acks = []
        for (topic, partition), group in groups.items():
            batch = self.producer.create_batch()
            for message in group:
                if batch.append(key=message.key, value=message.value, timestamp=None, headers=message.headers) is None:
                    acks.append(await self.producer.send_batch(batch, topic, partition=partition))
                    batch = self.producer.create_batch()
                    batch.append(key=message.key, value=message.value, timestamp=None, headers=message.headers)
            acks.append(await self.producer.send_batch(batch, topic, partition=partition))
        return acks


def _brokers_away(exc: BaseException) -> bool:
    """A send worth trying again: the brokers are away or moving (a retriable error, a timeout).
    What the broker refuses outright (a message too large, no authorisation) is raised at once:
    sending the same bytes again would be refused for ever."""
    return isinstance(exc, KafkaTimeoutError) or (isinstance(exc, KafkaError) and bool(exc.retriable))


class PartitionChoices:
    """The partition of each message of one `send_all`, chosen by the default partitioner once per
    key and partition list. A rejection's DLQ record and its `rejected` event carry the same key,
    and aiokafka's murmur2 is pure Python: hashing each key once takes half of it off intake's
    rejection path. Topics whose partitions are the same share their choices; a message without
    a key is placed afresh each time (at random, as the default partitioner does)."""

    def __init__(self, partitioner: Callable[[bytes | None, list[int], list[int]], int]) -> None:
        self.partitioner = partitioner
        self.topics: dict[str, tuple[list[int], dict[bytes, int]]] = {}
        self.layouts: dict[tuple[int, ...], tuple[list[int], dict[bytes, int]]] = {}

    def __contains__(self, topic: str) -> bool:
        return topic in self.topics

    def add(self, topic: str, partitions: set[int]) -> None:
        """A topic's partitions, sorted as the producer hands them to its partitioner."""
        known = sorted(partitions)
        self.topics[topic] = self.layouts.setdefault(tuple(known), (known, {}))

    def choose(self, topic: str, key: bytes | None) -> int:
        known, chosen = self.topics[topic]
        if key is None:
            return self.partitioner(None, known, known)
        partition = chosen.get(key)
        if partition is None:
            partition = chosen[key] = self.partitioner(key, known, known)
        return partition
