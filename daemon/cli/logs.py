"""`adapterd logs ID [--follow]`: the trainer's log of a request, from whichever host runs or ran it.

A job's log stays on the host that ran it (`jobs/<id>/child.log`). Its `started` event names that
host's endpoint (`endpoint`, set when the host has the fleet's `logs_token`), which serves the log
at `/jobs/ID/log?offset=N` to whoever sends the token. This reads the request's events for the
latest `started`, then the log from there; with `--follow`, it goes on reading both until the
request's terminal event, switching host when an attempt starts on another one. The token goes
only to the event's host and port, as daemon/cli/log_endpoint.py decides, and what is printed has
its control characters escaped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from daemon.cli.log_endpoint import LogsError, Printable, fetch, printable
from daemon.kafka.event_reader import EventStream
from daemon.ops.http_server import LOG_CHUNK_BYTES
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys
from schemas import TERMINAL_TYPES, Started

__all__ = ["LogsError", "show_log"]

POLL_S = 1.0


@dataclass
class Where:
    """What the request's events said so far: the endpoint of its latest start, and whether it ended."""

    endpoint: str | None = None
    host: str | None = None
    started: bool = False
    ended: bool = False
    offsets: dict[str, int] = field(default_factory=dict)  # how much of each host's log was copied
    scheme: str | None = None  # the latest start's endpoint_scheme


async def show_log(settings: Settings, request_id: str, follow: bool, write: Callable[[bytes], None]) -> None:
    """Write the request's log with `write`, from its latest attempt's host; with `follow`, until it ends."""
    if settings.logs_token is None:
        raise LogsError(
            "logs_token is not set: the fleet's hosts serve their job logs only to whoever sends it (logs_token_file)"
        )
    token = settings.logs_token.get_secret_value()
    where = Where()
    shown = Printable()  # the log may hold escape codes: the terminal gets them escaped
    cafile = settings.http_cafile

    def copy(wait: bool = False) -> Awaitable[None]:
        return _copy(where, request_id, token, lambda data: write(shown(data)), cafile, wait)

    if event_keys(settings) is None:  # an unverified `started` could name any endpoint, and the token would go there
        raise LogsError(
            "no event_verify_keys: the logs token goes only to an endpoint named by an event the fleet signed"
        )
    async with EventStream(settings) as stream:

        async def watch(events_follow: bool) -> None:
            async for event in stream.events(request_id, until_terminal=events_follow, follow=events_follow):
                if isinstance(event, Started):
                    where.endpoint, where.host, where.started = event.endpoint, event.host, True
                    where.scheme = event.endpoint_scheme
                where.ended = where.ended or event.type in TERMINAL_TYPES

        if not follow:
            await watch(False)
            await copy()
            write(shown(b"", final=True))
            return
        watching = asyncio.create_task(watch(True))
        try:
            while True:
                ended = where.ended  # read before the copy: what the log holds then is all of it
                await copy(wait=not ended)
                if ended or watching.done():
                    write(shown(b"", final=True))
                    return
                await asyncio.sleep(POLL_S)
        finally:
            watching.cancel()


async def _copy(
    where: Where, request_id: str, token: str, write: Callable[[bytes], None], cafile: Path | None, wait: bool = False
) -> None:
    """Copy what is new in the log at the latest start's host; an attempt on another host starts at 0."""
    if not where.started:
        if wait:
            return  # not started yet: the next look may find it
        raise LogsError(f"{request_id} has not started on any host (adapterd get {request_id})")
    if where.endpoint is None:
        raise LogsError(f"{printable(str(where.host))} runs {request_id} but serves no logs: its logs_token is not set")
    offset = where.offsets.get(where.endpoint, 0)
    while True:
        data, size = await asyncio.to_thread(
            fetch, where.endpoint, where.scheme, request_id, offset, token, cafile, LOG_CHUNK_BYTES
        )
        write(data)
        offset += len(data)
        where.offsets[where.endpoint] = offset
        if len(data) < LOG_CHUNK_BYTES or offset >= size:
            return
