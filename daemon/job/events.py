"""The one place a job's events are published: `accepted` (the scheduler), `started`, `progress`
and `checkpoint` (its supervisor), its outcome (the job), and the outcomes the scheduler gives a
request without a job (`cancelled` before it started, `failed` for a record that kept failing
outside its job: daemon/jobs/faults.py). Each carries the job's common fields
(request id, metadata, host, attempt) and goes out with the request's trace headers, acknowledged
before the job takes its next step."""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.kafka.trace import Headers, trace_context
from schemas.events import EventBase

E = TypeVar("E", bound=EventBase)


class Named(Protocol):
    """What a job's events carry of its request: its id and metadata. A `RequestBase` is one; the fleet's announcer
    keeps only these of a request no host has read (daemon/fleet/announcer.py), not its decoded rows."""

    @property
    def request_id(self) -> str: ...

    @property
    def metadata(self) -> dict[str, str]: ...


class JobEvents:
    def __init__(self, publisher: Publisher, request: Named, host: str, attempt: int, trace: Headers) -> None:
        self.publisher = publisher
        self.request = request
        self.host = host
        self.attempt = attempt
        self.trace = trace

    @classmethod
    def for_record(cls, publisher: Publisher, request: Named, host: str, attempt: int, record: Record) -> JobEvents:
        """The events of a request read from `record`, with its trace headers (those of a
        request without a running job)."""
        return cls(publisher, request, host, attempt, trace_context(record))

    def common(self, *, metadata: bool = True) -> dict[str, Any]:
        """The fields every event of the job carries (`metadata=False`: all but the request's
        metadata, for an event about a record the broker may have refused for its size)."""
        return {
            "request_id": self.request.request_id,
            "host": self.host,
            "attempt": self.attempt,
            **({"metadata": self.request.metadata} if metadata else {}),
        }

    def event(self, kind: type[E], *, metadata: bool = True, **fields: Any) -> E:
        """One of the job's events, from its own fields and the common ones."""
        return kind(**self.common(metadata=metadata), **fields)

    async def publish(self, kind: type[E], **fields: Any) -> E:
        """Build one of the job's events from its own fields and publish it."""
        event = self.event(kind, **fields)
        await self.announce(event)
        return event

    async def announce(self, event: EventBase) -> None:
        """Publish an event of the job's that is already built (its outcome)."""
        await self.publisher.publish(event, self.trace)
