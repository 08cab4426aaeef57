"""The one place a job's events are published: `accepted` (the scheduler), `started`, `progress`
and `checkpoint` (its supervisor), its outcome (the job). Each carries the job's common fields
(request id, metadata, host, attempt) and goes out with the request's trace headers, acknowledged
before the job takes its next step."""

from __future__ import annotations

from typing import Any, TypeVar

from daemon.kafka.publisher import Publisher
from daemon.kafka.trace import Headers
from schemas.events import EventBase
from schemas.request import RequestBase

E = TypeVar("E", bound=EventBase)


class JobEvents:
    def __init__(self, publisher: Publisher, request: RequestBase, host: str, attempt: int, trace: Headers) -> None:
        self.publisher = publisher
        self.request = request
        self.host = host
        self.attempt = attempt
        self.trace = trace

    def common(self) -> dict[str, Any]:
        """The fields every event of the job carries."""
        return {"request_id": self.request.request_id, "metadata": self.request.metadata, "host": self.host, "attempt": self.attempt}

    async def publish(self, kind: type[E], **fields: Any) -> E:
        """Build one of the job's events from its own fields and publish it."""
        event = kind(**self.common(), **fields)
        await self.announce(event)
        return event

    async def announce(self, event: EventBase) -> None:
        """Publish an event of the job's that is already built (its outcome)."""
        await self.publisher.publish(event, self.trace)
