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
from dataclasses import dataclass
from datetime import datetime, timedelta

from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import Event
from schemas.events import Accepted, Started, Succeeded

# The state a request is in after each event type.
STATE_AFTER = {
    "accepted": "queued",
    "retrying": "queued",
    "started": "running",
    "progress": "running",
    "checkpoint": "running",
    "succeeded": "succeeded",
    "failed": "failed",
    "cancelled": "cancelled",
    "rejected": "rejected",
    # With priority classes: read and waiting for a slot; stopped for a higher class, and waiting again.
    "queued": "queued",
    "preempted": "queued",
}
STATES = ("queued", "running", "succeeded", "failed", "cancelled", "rejected")
_AGE = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


@dataclass
class RequestSummary:
    """One request as its events say it is now."""

    request_id: str
    state: str
    method: str | None
    host: str
    attempt: int
    since: datetime  # its first event
    last: datetime  # its latest event
    detail: str
    events: int
    latest: str = ""  # the type of its latest event

    def line(self, now: datetime) -> str:
        return (
            f"{self.request_id:<28} {self.state:<10} {self.method or '-':<12} {self.host:<16} {self.attempt:>3} "
            f"{_ago(now - self.last):>8}  {self.detail}"
        )


HEADER = f"{'REQUEST':<28} {'STATE':<10} {'METHOD':<12} {'HOST':<16} {'TRY':>3} {'LAST':>8}  DETAIL"


async def history(settings: Settings, request_id: str | None = None) -> list[Event]:
    """The events topic from its beginning to its end as of now, or one request's events in it."""
    async with EventStream(settings) as stream:
        return [event async for event in stream.events(request_id, until_terminal=False, follow=False)]


def fold(events: Iterable[Event]) -> dict[str, RequestSummary]:
    """Each request's latest state, from its events in the order they were published."""
    jobs: dict[str, RequestSummary] = {}
    for event in events:
        if event.request_id is None:
            continue  # a rejected message whose id could not be read: no request to list
        job = jobs.get(event.request_id)
        if job is None or (event.type == "accepted" and job.state in ("succeeded", "failed", "cancelled", "rejected")):
            job = jobs[event.request_id] = RequestSummary(
                event.request_id, "queued", None, event.host, event.attempt, event.time, event.time, "", 0
            )
        if isinstance(event, Succeeded) and event.duplicate and job.state == "succeeded":
            job.events += 1
            continue  # a redelivered request's repeat: the same outcome
        job.state, job.host, job.attempt, job.last = STATE_AFTER[event.type], event.host, event.attempt, event.time
        job.method = event.method if isinstance(event, Accepted | Started | Succeeded) else job.method
        job.detail, job.latest = detail(event), event.type
        job.events += 1
    return jobs


def detail(event: Event) -> str:
    """What an operator wants to see of a request's latest event, on one line."""
    kind = event.type
    if kind == "succeeded":
        where = f" ({event.sink})" if event.sink == "local" else ""  # type: ignore[union-attr]
        return f"published {event.published}: {event.repo_id}@{event.revision}{where}"  # type: ignore[union-attr]
    if kind in ("failed", "retrying"):
        return f"{event.code} in {event.stage}: {event.message[:120]}"  # type: ignore[union-attr]
    if kind == "rejected":
        first = event.errors[0]  # type: ignore[union-attr]
        return f"{event.reason}: {first.path or '(message)'}: {first.message[:100]}"  # type: ignore[union-attr]
    if kind == "progress":
        return f"{event.stage} step {event.step}/{event.total_steps}"  # type: ignore[union-attr]
    if kind == "started":
        return f"slot {event.slot}"  # type: ignore[union-attr]
    if kind == "checkpoint":
        return f"checkpoint at step {event.step}"  # type: ignore[union-attr]
    if kind == "cancelled":
        return event.reason  # type: ignore[union-attr]
    if kind == "queued":
        eta = f", ETA {event.eta_s:.0f} s" if event.eta_s is not None else ""  # type: ignore[union-attr]
        return f"{event.priority_class}/{event.team}: place {event.place}{eta}"  # type: ignore[union-attr]
    if kind == "preempted":
        return f"preempted by {event.by} at step {event.step} ({event.preemptions}x); waits again"  # type: ignore[union-attr]
    return ""


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
