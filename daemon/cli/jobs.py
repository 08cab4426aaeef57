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

A request is a row of the table (`COLUMNS`, `row`) or, with `--json`, an object (`document`): daemon/cli/listing.py
prints either.

`history` and `fold` read and fold the whole events topic, as both verbs did before the table: what the tests hold
the table's listing equal to.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from daemon.cli.listing import JOB_FIELDS, Column
from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from daemon.table.entry import STATES, EntryHead, TableEntry, folded
from daemon.table.reader import TableRead
from schemas import Event

__all__ = ["COLUMNS", "STATES", "RequestSummary", "age", "document", "fold", "history", "row", "say"]

_AGE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}

RequestSummary = TableEntry  # one request as its events say it is now (daemon/table/entry.py)


COLUMNS = (
    Column("REQUEST"),
    Column("STATE"),
    Column("METHOD"),
    Column("HOST"),
    Column("TRY", right=True),
    Column("LAST", right=True),
    Column("DETAIL"),
)


def row(job: EntryHead, now: datetime) -> list[str]:
    """A request's row of `adapterd jobs`' table (`COLUMNS`)."""
    return [job.request_id, job.state, job.method or "-", job.host, str(job.attempt), _ago(now - job.last), job.detail]


def document(job: EntryHead) -> dict[str, Any]:
    """A request as `adapterd jobs --json` and `get --json` give it: its `JOB_FIELDS`."""
    return {name: getattr(job, name) for name in JOB_FIELDS}


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
