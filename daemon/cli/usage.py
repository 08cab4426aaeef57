"""`adapterd usage`: the period asked for, the events of it read from the events topic, and the GPU-hours per team and
class (daemon/fleet/policy/chargeback.py's fold) printed as a table or JSON.

Only the events from the period's start less a look-back are read: the broker finds where each partition's records of
that time begin (the reader's `since`, Kafka's offsets_for_times), so a month's report reads a month and a week, not
the whole topic. The look-back is there for the runs that started before the period and ran into it: by default the
longest a job may run (the host's `max_timeout_s`) and a day; a run that started earlier still is not seen.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from daemon.cli.jobs import age
from daemon.cli.listing import Column
from daemon.fleet.policy.chargeback import GROUPINGS, Row
from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import Event

DEFAULT_SINCE = "30d"


def moment(option: str, text: str) -> datetime:
    """An ISO-8601 time of `option` (UTC where it names no offset); a ValueError naming the option otherwise."""
    try:
        found = datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise ValueError(f"{option}: not an ISO-8601 time: {text!r} (2026-11-01, 2026-11-01T08:00:00Z)") from exc
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def period(since: str | None, start: str | None, end: str | None, now: datetime) -> tuple[datetime, datetime]:
    """The period asked for: `--since AGE` up to now (30d when nothing is given), or `--from` to `--to` (now when
    left out). A ValueError naming the option for anything else."""
    if since is not None and (start is not None or end is not None):
        raise ValueError("--since counts back from now: give it alone, or --from (and --to) instead")
    if end is not None and start is None:
        raise ValueError("--to needs --from")
    if start is None:
        try:
            return now - age(since or DEFAULT_SINCE), now
        except ValueError as exc:
            raise ValueError(f"--since: {exc}") from exc
    begins, ends = moment("--from", start), moment("--to", end) if end is not None else now
    if begins >= ends:
        raise ValueError(f"--from {begins.isoformat()} is not before {'--to' if end else 'now,'} {ends.isoformat()}")
    return begins, ends


def groupings(by: str) -> list[str]:
    """`--by`: team, class, or both comma-separated; a ValueError naming the option otherwise."""
    named = [part.strip() for part in by.split(",")]
    if not named or any(part not in GROUPINGS for part in named) or len(set(named)) != len(named):
        raise ValueError(f"--by: {by!r} is not team, class, or team,class")
    return named


def look_back(settings: Settings, given: str | None) -> timedelta:
    """How far before the period's start events are read: `--look-back`, else the longest a job may run and a day."""
    if given is not None:
        try:
            return age(given)
        except ValueError as exc:
            raise ValueError(f"--look-back: {exc}") from exc
    return timedelta(seconds=settings.max_timeout_s or 7 * 86_400) + timedelta(days=1)


async def read_events(settings: Settings, since: datetime) -> list[Event]:
    """The events topic's verified events from the first record at or after `since` to its end as of now."""
    async with EventStream(settings, since=since.timestamp()) as stream:
        return [event async for event in stream.events(until_terminal=False, follow=False)]


def rows_of(rows: Sequence[Row], by: Sequence[str], begins: datetime, ends: datetime) -> list[dict[str, object]]:
    """`--json`'s document: an object a row, with `USAGE_FIELDS` (daemon/cli/listing.py) in their order, the groupings
    only where asked for."""
    return [
        {
            **({"team": row.team} if "team" in by else {}),
            **({"priority_class": row.priority_class} if "class" in by else {}),
            "gpu_hours": round(row.gpu_hours, 4),
            "jobs": row.jobs,
            "runs": row.runs,
            "from": begins.isoformat(),
            "to": ends.isoformat(),
        }
        for row in rows
    ]


def table_of(rows: Sequence[Row], by: Sequence[str]) -> tuple[list[Column], list[list[str]]]:
    """The table's columns and cells, as every listing verb prints them (daemon/cli/listing.py `show_table`)."""
    columns = [Column("TEAM")] if "team" in by else []
    columns += [Column("CLASS")] if "class" in by else []
    columns += [Column("GPU-HOURS", right=True), Column("JOBS", right=True), Column("RUNS", right=True)]
    cells = []
    for row in rows:
        names = [row.team or "-"] if "team" in by else []
        names += [row.priority_class or "-"] if "class" in by else []
        cells.append([*names, f"{row.gpu_hours:.2f}", str(row.jobs), str(row.runs)])
    return columns, cells
