"""`adapterd cancel --team T --class C --selector key=value`: cancel a sweep, every request that matches,
waiting or running, and say how many and which.

Waiting requests are those `adapterd jobs --state queued` lists (daemon/cli/waiting.py); running ones are
those whose latest event says so (the table of requests and the events past it, daemon/table/reader.py). A
request matches when every given test holds: its team, its class, and each metadata pair. A request's class,
team and metadata are read from its record where one is past a committed offset (a running job's is, until it
ends), else from its events. Each match gets the control topic's ordinary cancel (daemon/cli/cancel.py's
message, keyed by the request id): a running job stops and publishes `cancelled`; a waiting one is skipped
when a daemon reaches it.
With `--dry-run` the matches are listed and nothing is sent.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from aiokafka import AIOKafkaProducer

from daemon.cli.jobs import say
from daemon.cli.waiting import Backlog, named_in_events, read_backlog
from daemon.errors import UsageError
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from daemon.settings.fleet import team_of
from daemon.table.reader import read_table
from schemas import Cancel
from schemas.request_base import QUEUE_NAME_PATTERN


@dataclass(frozen=True)
class Selector:
    """What a request of the sweep has: each test given must hold (None: any)."""

    team: str | None
    priority_class: str | None
    metadata: dict[str, str]

    def takes(self, priority_class: str | None, team: str, metadata: dict[str, str]) -> bool:
        return (
            (self.team is None or team == self.team)
            and (self.priority_class is None or priority_class == self.priority_class)
            and all(metadata.get(key) == value for key, value in self.metadata.items())
        )

    def said(self) -> str:
        parts = ([f"team {self.team}"] if self.team else []) + (
            [f"class {self.priority_class}"] if self.priority_class else []
        )
        return ", ".join(parts + [f"metadata {key}={value}" for key, value in self.metadata.items()])


@dataclass(frozen=True)
class Match:
    request_id: str
    state: str  # waiting or running
    priority_class: str | None
    team: str
    where: str

    def line(self) -> str:
        return f"  {self.request_id:<28} {self.state:<8} {self.priority_class or '-':<10} {self.team:<12} {self.where}"


def selector(settings: Settings, team: str | None, priority_class: str | None, pairs: list[str]) -> Selector:
    """The command line's tests, checked: a UsageError naming the option for one that can match nothing by its form."""
    if team is not None and not re.fullmatch(QUEUE_NAME_PATTERN, team):
        raise UsageError(f"--team: {team!r} is not a team name (a-z, 0-9, _ and -, up to 63 characters)")
    names = [c.name for c in settings.priority_classes]
    if priority_class is not None and priority_class not in names:
        known = f"one of {', '.join(names)}" if names else "this fleet has no priority classes (priority_classes)"
        raise UsageError(f"--class: unknown class {priority_class!r}; {known}")
    metadata: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UsageError(f"--selector: {pair!r} is not key=value (a metadata key and the value it must have)")
        if key in metadata and metadata[key] != value:
            raise UsageError(f"--selector: {key} given twice with different values; no request can match both")
        metadata[key] = value
    if team is None and priority_class is None and not metadata:
        raise UsageError("cancel: give a request id, or --team, --class or --selector for a sweep")
    return Selector(team, priority_class, metadata)


def matches(backlog: Backlog, chosen: Selector, settings: Settings) -> list[Match]:
    """The waiting requests in the order listed, then the running ones, that the selector takes."""
    found = [
        Match(w.request_id, "waiting", w.priority_class, w.team, w.where)
        for w in backlog.waiting
        if w.stage != "undecodable" and chosen.takes(w.priority_class, w.team, w.metadata)
    ]
    named = named_in_events(backlog.events)
    for request_id, job in backlog.jobs.items():
        if job.state != "running":
            continue
        record = backlog.records.get(request_id)
        if record is not None:
            priority_class, team, metadata = record.priority_class, record.team, record.metadata
        else:
            from_events = named.get(request_id, (None, None, {}))
            priority_class, team, metadata = (
                from_events[0] or settings.default_class,
                team_of(from_events[1]),
                from_events[2],
            )
        if chosen.takes(priority_class, team, metadata):
            found.append(Match(request_id, "running", priority_class, team, f"on {job.host}"))
    return found


async def sweep(settings: Settings, chosen: Selector, reason: str, dry_run: bool) -> list[str]:
    """Find the matches, send each its cancel unless it is a dry run, and say what was matched and done."""
    table = await read_table(settings)
    say(table)
    found = matches(await read_backlog(settings, table), chosen, settings)
    waiting = sum(1 for match in found if match.state == "waiting")
    lines = [f"matched {len(found)} request(s) with {chosen.said()}: {waiting} waiting, {len(found) - waiting} running"]
    lines += [match.line() for match in found]
    if not found:
        return [*lines, "nothing to cancel, nothing sent"]
    if dry_run:
        return [
            *lines,
            f"dry run: nothing sent (without --dry-run, {len(found)} cancel(s) go to {settings.control_topic})",
        ]
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all", enable_idempotence=True)
    try:
        await producer.start()
        sent = [
            await producer.send(
                settings.control_topic,
                Cancel(request_id=match.request_id, reason=reason).model_dump_json().encode(),
                key=match.request_id.encode(),
            )
            for match in found
        ]
        await asyncio.gather(*sent)  # every cancel acknowledged before the command says it sent them
    finally:
        await producer.stop()
    return [
        *lines,
        f"sent {len(found)} cancel(s) to {settings.control_topic}: each running job stops and publishes `cancelled`; "
        "each waiting request is skipped when a daemon reaches it, with `cancelled` and no training "
        "(until then `adapterd jobs --state queued` leaves it out, its cancel pending)",
    ]
