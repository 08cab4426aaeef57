"""`adapterd jobs` and `adapterd get`: where every request stands across the fleet, from the events topic.

The events topic already holds every request's whole history, from every host, and is what
consumers read; the latest state of a request is its last event. So both verbs read it from its
beginning to its end as of the call and fold the events by request id, rather than the daemon
keeping a compacted state topic beside it: that would be one more topic to create, to size and to
keep true under the same faults, for a listing that reading the events gives already. What it
costs: a request older than the events topic's retention is not listed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime, timedelta

from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from daemon.table.entry import STATES, TableEntry, folded
from schemas import Event

__all__ = ["HEADER", "STATES", "RequestSummary", "age", "fold", "history", "line"]

_AGE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}

RequestSummary = TableEntry  # one request as its events say it is now (daemon/table/entry.py)


def line(job: TableEntry, now: datetime) -> str:
    """A request's line of `adapterd jobs`."""
    return (
        f"{job.request_id:<28} {job.state:<10} {job.method or '-':<12} {job.host:<16} {job.attempt:>3} "
        f"{_ago(now - job.last):>8}  {job.detail}"
    )


HEADER = f"{'REQUEST':<28} {'STATE':<10} {'METHOD':<12} {'HOST':<16} {'TRY':>3} {'LAST':>8}  DETAIL"


async def history(settings: Settings, request_id: str | None = None) -> list[Event]:
    """The events topic from its beginning to its end as of now, or one request's events in it."""
    async with EventStream(settings) as stream:
        return [event async for event in stream.events(request_id, until_terminal=False, follow=False)]


def fold(events: Iterable[Event]) -> dict[str, TableEntry]:
    """Each request's latest state, from its events in the order they were published (the table's fold)."""
    jobs: dict[str, TableEntry] = {}
    for event in events:
        entry = folded(jobs.get(event.request_id or ""), event)
        if entry is not None:
            jobs[entry.request_id] = entry
    return jobs


def age(text: str) -> timedelta:
    """`30m`, `2h`, `7d`, `90s`: a ValueError for anything else."""
    match = _AGE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an age: {text!r} (a number and s, m, h or d: 30m, 2h, 7d)")
    return timedelta(**{_UNITS[match.group(2)]: int(match.group(1))})


def _ago(delta: timedelta) -> str:
    seconds = max(0, int(delta.total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"
