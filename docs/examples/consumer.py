"""Deploy what adapterd announces, with nothing but pydantic, aiokafka, cryptography and adapterd's
`schemas/` package (no torch, no TRL):

    python docs/examples/consumer.py kafka.internal:9092 my-team /etc/adapterd/event-verify-keys [REQUEST_ID [TOPIC]]

Reads `adapterd.events` as a consumer group and deploys each adapter whose `succeeded` event says
`published: "main"`: one that failed its evaluation gate also ends `succeeded`, in a pull request, a
side branch or nowhere, and a redelivered request's repeat says `duplicate: true`. Only events the
fleet signed are acted on: each is checked against the fleet's public keys (the file names one a
line, `adapterd keys` prints them; two while keys rotate) before it is read, and one that is
unsigned or wrongly signed (written to the topic by someone else) is ignored and counted
(docs/guarantees.md). A genuine event written again verbatim verifies again: it is the same event (the
same `event_id`) and is dropped as a repeat, by a memory of the last `SEEN_IDS` ids handled (bounded:
a repeat written after that many other events, or after this process restarts, is handled again; deploy
idempotently by `commit_sha` for those). Events are read with `schemas.read_event`, so a newer daemon's
fields and event types do not stop it (docs/events.md, "How the events change"). The offset is committed
after each event is handled. With REQUEST_ID, it stops after that request's terminal event (the tests use it).
"""

from __future__ import annotations

import asyncio
import sys
from collections import OrderedDict
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from schemas import TERMINAL_TYPES, EventKeys, Succeeded, UnverifiedEvent, read_event

SEEN_IDS = 100_000  # the event ids remembered to drop repeats by: a few MB


class SeenIds:
    """The last `size` event ids handled, the oldest forgotten first."""

    def __init__(self, size: int = SEEN_IDS) -> None:
        self.size = size
        self.ids: OrderedDict[str, None] = OrderedDict()

    def first(self, event_id: str) -> bool:
        """True the first time `event_id` is offered (remembering it), False for a repeat."""
        if event_id in self.ids:
            return False
        self.ids[event_id] = None
        if len(self.ids) > self.size:
            self.ids.popitem(last=False)
        return True


def deploy(event: Succeeded) -> None:
    """Where your deployment goes: here, a line saying what would be deployed."""
    print(
        f"deploy {event.repo_id}@{event.revision} ({event.commit_sha or event.location}) for {event.request_id}",
        flush=True,
    )


async def consume(
    bootstrap_servers: str, group_id: str, keys_file: str, until: str | None = None, topic: str = "adapterd.events"
) -> None:
    keys = EventKeys.from_file(Path(keys_file))
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap_servers,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    ignored, repeated, seen = 0, 0, SeenIds()
    await consumer.start()
    print(f"reading {topic} as the group {group_id} (Ctrl-C stops)", flush=True)
    try:
        async for record in consumer:
            try:
                event = read_event(record.value or b"{}", keys=keys, headers=record.headers)
            except UnverifiedEvent as exc:
                ignored += 1  # not the fleet's: never acted on
                print(
                    f"ignored an event without the fleet's signature ({exc.reason}) at "
                    f"{record.partition}@{record.offset}",
                    flush=True,
                )
                await consumer.commit()
                continue
            if event is None:
                continue  # a type this version does not know: not one to act on
            if not seen.first(event.event_id):
                repeated += 1  # genuine, but handled already: written again (a producer's retry, a replay)
                print(f"dropped a repeat of event {event.event_id} at {record.partition}@{record.offset}", flush=True)
                await consumer.commit()
                continue
            if isinstance(event, Succeeded) and event.published == "main" and not event.duplicate:
                deploy(event)
            elif isinstance(event, Succeeded):
                print(
                    f"not deployed: {event.request_id} was published to {event.published}"
                    + (" (a repeat)" if event.duplicate else ""),
                    flush=True,
                )
            await consumer.commit()
            if until is not None and event.request_id == until and event.type in TERMINAL_TYPES:
                return
    finally:
        await consumer.stop()
        print(f"ignored {ignored} event(s) without the fleet's signature; dropped {repeated} repeat(s)", flush=True)


if __name__ == "__main__":
    try:
        asyncio.run(consume(sys.argv[1], sys.argv[2], sys.argv[3], *sys.argv[4:6]))
    except KeyboardInterrupt:  # Ctrl-C: the consumer was closed on the way out (`finally`), no traceback to show
        sys.exit(130)
