"""`adapterd cancel ID`: what the request's events say of it, and what the cancel will do.

It reads the request's state (as `adapterd get` does: its entry in the table of requests and its events past it,
from one partition of each, daemon/table/reader.py `read_request`) before sending anything: a running request's
host stops the job; a queued one is skipped when it is reached; one that already ended is left as
it is and nothing is sent. A request no host has published an event of may still wait unread in
the requests topic (a partition busy with an earlier request), so the cancel is sent: daemons keep
every cancel and skip that request when they reach it, and the answer says that the id was never
seen, in case it was mistyped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from daemon.cli.jobs import RequestSummary, say
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from daemon.table.reader import read_request
from schemas import Cancel
from schemas.control import Control

ENDED = ("succeeded", "failed", "cancelled", "rejected")


@dataclass(frozen=True)
class Plan:
    """Whether to send the cancel, and the line that says what is known and what will happen."""

    send: bool
    said: str


def plan(request_id: str, job: RequestSummary | None, control_topic: str) -> Plan:
    """What to do with a cancel of `request_id`, whose events fold to `job` (None: none published)."""
    if job is None:
        return Plan(
            True,
            f"{request_id}: never seen (no host published an event of it); the cancel is sent to {control_topic}: "
            "if it waits unread in the requests topic, the daemon that reaches it skips it; if the id is mistyped, "
            "nothing happens (adapterd jobs lists the requests seen)",
        )
    if job.state in ENDED:
        return Plan(
            False,
            f"{request_id}: already {job.state} on {job.host} (attempt {job.attempt}); nothing to cancel, nothing sent",
        )
    if job.state == "running":
        return Plan(
            True,
            f"{request_id}: running on {job.host} (attempt {job.attempt}); the cancel is sent to {control_topic}: "
            "that host stops the job and publishes `cancelled` (adapterd get shows it)",
        )
    return Plan(
        True,
        f"{request_id}: queued on {job.host}; the cancel is sent to {control_topic}: the request is skipped when it is "
        "reached, with a `cancelled` event and no training; until then `adapterd jobs --state queued` leaves it out "
        "and `adapterd get` says its cancel is pending",
    )


async def cancel(settings: Settings, message: Cancel, *, dry_run: bool = False) -> str:
    """Read the request's state, send the cancel when it can still do something (not on a dry
    run), and say what happens."""
    return await send_when_it_can(
        settings, message, lambda job: plan(message.request_id, job, settings.control_topic), dry_run=dry_run
    )


async def send_when_it_can(
    settings: Settings, message: Control, decide: Callable[[RequestSummary | None], Plan], *, dry_run: bool
) -> str:
    """The one way a control message is sent (a cancel, a hold, a pause...: daemon/cli/holds.py too): the request's
    state read from the table of requests and shown, `decide` says whether the message can still do something and what
    happens, and it is sent (acknowledged by every in-sync replica) unless it cannot or this is a dry run."""
    request_id = message.request_id
    read = await read_request(settings, request_id)
    say(read)
    decided = decide(read.entries.get(request_id))
    if decided.send and dry_run:
        return f"{decided.said} (dry run: nothing sent)"
    if decided.send:
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all", enable_idempotence=True)
        try:
            await producer.start()
            await producer.send_and_wait(
                settings.control_topic, message.model_dump_json().encode(), key=request_id.encode()
            )
        finally:
            await producer.stop()
    return decided.said
