"""Deploy what adapterd announces, with nothing but pydantic, aiokafka, cryptography and adapterd's
`schemas/` package (no torch, no TRL):

    python docs/examples/consumer.py kafka.internal:9092 my-team /etc/adapterd/event-verify-keys [REQUEST_ID [TOPIC]]

Reads `adapterd.events` as a consumer group and deploys each adapter whose `succeeded` event says
`published: "main"`: one that failed its evaluation gate also ends `succeeded`, in a pull request, a
side branch or nowhere, and a redelivered request's repeat says `duplicate: true`. Only events the
fleet signed are acted on: each is checked against the fleet's public keys (the file names one a
line, `adapterd keys` prints them; two while keys rotate) before it is read, and one that is
unsigned or wrongly signed (written to the topic by someone else) is ignored and counted
(docs/guarantees.md). Events are read with `schemas.read_event`, so a newer daemon's fields and event
types do not stop it (docs/events.md, "How the events change"). The offset is committed after each
event is handled. With REQUEST_ID, it stops after that request's terminal event (the tests use it).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from aiokafka import AIOKafkaConsumer

from schemas import TERMINAL_TYPES, EventKeys, Succeeded, UnverifiedEvent, read_event


def deploy(event: Succeeded) -> None:
    """Where your deployment goes: here, a line saying what would be deployed."""
    print(f"deploy {event.repo_id}@{event.revision} ({event.commit_sha or event.location}) for {event.request_id}", flush=True)


async def consume(bootstrap_servers: str, group_id: str, keys_file: str, until: str | None = None, topic: str = "adapterd.events") -> None:
    keys = EventKeys.from_file(Path(keys_file))
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap_servers, group_id=group_id,
                                enable_auto_commit=False, auto_offset_reset="earliest")
    ignored = 0
    await consumer.start()
    try:
        async for record in consumer:
            try:
                event = read_event(record.value or b"{}", keys=keys, headers=record.headers)
            except UnverifiedEvent as exc:
                ignored += 1  # not the fleet's: never acted on
                print(f"ignored an event without the fleet's signature ({exc.reason}) at {record.partition}@{record.offset}", flush=True)
                await consumer.commit()
                continue
            if event is None:
                continue  # a type this version does not know: not one to act on
            if isinstance(event, Succeeded) and event.published == "main" and not event.duplicate:
                deploy(event)
            elif isinstance(event, Succeeded):
                print(f"not deployed: {event.request_id} was published to {event.published}" + (" (a repeat)" if event.duplicate else ""), flush=True)
            await consumer.commit()
            if until is not None and event.request_id == until and event.type in TERMINAL_TYPES:
                return
    finally:
        await consumer.stop()
        print(f"ignored {ignored} event(s) without the fleet's signature", flush=True)


if __name__ == "__main__":
    asyncio.run(consume(sys.argv[1], sys.argv[2], sys.argv[3], *sys.argv[4:6]))
