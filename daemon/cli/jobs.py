"""`adapterd jobs` and `adapterd get`: where every request stands across the fleet, from the table of requests.

A request's latest state is its events folded (daemon/table/entry.py `folded`), and the daemons keep that fold in a
compacted state topic, the table of requests (daemon/table/), so neither verb reads every event the fleet ever said:
`jobs` reads the table and folds on top the events past the keepers' committed offsets (daemon/table/reader.py
`read_table`); `get` reads its request's entry from one partition of the state topic and that request's events from
one partition of the events topic, from its entry's first event on (`read_request`). Entries and events are taken
only when the fleet's keys verify them; what was not taken is said on stderr, one line each (`say`). The events topic
stays the record: where no keeper runs, or lags, the reader folds the events themselves, and the listing is the
same. What it costs: an ended request leaves the table `state_retention_s` after it ended (its tombstone), and, where
no table is kept, a request older than the events topic's retention is not listed.

`history` and `fold` read and fold the whole events topic, as both verbs did before the table: what the tests hold
the table's listing equal to.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta

from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from daemon.table.entry import STATES, EntryHead, TableEntry, folded
from daemon.table.reader import TableRead
from schemas import Event

__all__ = ["HEADER", "STATES", "RequestSummary", "age", "fold", "history", "line", "say"]

_AGE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}

RequestSummary = TableEntry  # one request as its events say it is now (daemon/table/entry.py)


def line(job: EntryHead, now: datetime) -> str:
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


def say(read: TableRead) -> None:
    """What the table's reader did not take (forged or malformed entries, events not verified or repeated), on stderr,
    one line each, as EventStream says the events it ignored."""
    for note in read.notes:
        print(f"adapterd: {note}", file=sys.stderr, flush=True)


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
