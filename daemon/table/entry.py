"""One request's state in the table of requests (`TableEntry`), and the one fold of an event into it (`folded`).

The same fold makes the table (its keeper, daemon/table/keeper.py), brings an entry up to date with the events
published after it (the commands and the fleet's view read the table, then the events past it), and lists a
request's own events (`adapterd get`): what a request's state is has one definition.

An entry keeps, beside what `adapterd jobs` shows, the latest event of each type (`recent`): what the fleet's view
folds of a request (its `accepted` with its class and team, its `started` with its GPUs, its latest `progress` and
`checkpoint`, a `preempted`'s count, the `queued` it was last told, its end), and of its earlier runs their
`accepted`, `started` and end (`earlier`: the slot-time a request preempted or retried held before), so a host's view
is made from the table without reading every event of the jobs it describes. And the ids of its latest events (`ids`)
and the events topic's place of the latest one folded (`partition`, `offset`): an event is folded once, whether read
again after a restart or written again by anyone.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

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
    # Reached, and waiting for the requests its `after` names (daemon/jobs/prerequisites.py).
    "waiting": "queued",
    # Held while waiting, or paused while running, until a release (daemon/jobs/holds.py); then waiting again.
    "held": "held",
    "paused": "held",
    "released": "queued",
}
STATES = ("queued", "held", "running", "succeeded", "failed", "cancelled", "rejected")
ENDED = frozenset({"succeeded", "failed", "cancelled", "rejected"})
KEPT_IDS = 32  # the event ids an entry remembers: a repeat of any of its latest 32 events is not folded again
EARLIER_RUNS = (
    2  # the runs before its latest whose slot-time an entry keeps (a request preempted, retried, redelivered)
)
# What the fleet's folds read of a success's metrics (daemon/fleet/policy/usage.py `Durations.observe`: the steps it
# trained and a step's steady pace); beside them, its durations.
KEPT_METRICS = frozenset({"train_runtime", "train_steps_per_second", "median_step_s"})
RUN_ENDS = frozenset(
    {"succeeded", "failed", "cancelled", "retrying", "preempted", "paused"}
)  # the events that end a run

State = Literal["queued", "held", "running", "succeeded", "failed", "cancelled", "rejected"]


class EntryHead(BaseModel):
    """What `adapterd jobs` lists of a request: its entry without its events (`TableEntry`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    request_id: str
    state: State
    method: str | None = None
    host: str
    attempt: int = Field(ge=1)
    since: datetime = Field(description="Its first event's time, as folded.")
    last: datetime = Field(description="Its latest event's time.")
    latest: str = Field(description="Its latest event's type.")
    detail: str = Field(description="What an operator wants to see of its latest event, on one line.")
    events: int = Field(ge=0, description="How many of its events were folded.")
    partition: int = Field(-1, ge=-1, description="The events topic's partition of its latest event folded; -1: none.")
    offset: int = Field(-1, ge=-1, description="The offset of its latest event folded in that partition; -1: none.")
    ids: list[str] = Field(default_factory=list, description="The ids of its latest events folded, oldest first.")

    @property
    def ended(self) -> bool:
        return self.state in ENDED


class TableEntry(EntryHead):
    """One request as its events say it is now: the value of its key in the state topic."""

    recent: list[Event] = Field(default_factory=list, description="The latest event of each type, oldest first.")
    earlier: list[Event] = Field(
        default_factory=list,
        description="Its earlier runs' `accepted`, `started` and end (the last EARLIER_RUNS runs): their slot-time.",
    )


def folded(entry: TableEntry | None, event: Event, partition: int = -1, offset: int = -1) -> TableEntry | None:
    """`entry` with `event` folded in (None for no entry yet: a new one), or None when the event is not folded: it
    has no request id (a rejected message whose id could not be read), or was folded already: its `event_id` is among
    the entry's, or its place in the events topic (`partition`, `offset`) is at or before the entry's latest (a topic
    given more partitions since puts a request's later events in another partition, whose offsets say nothing of the
    first's). A redelivered request's repeat of its success changes nothing but the count."""
    request_id = event.request_id
    if request_id is None:
        return None
    if entry is not None and (
        event.event_id in entry.ids or (partition == entry.partition and 0 <= offset <= entry.offset)
    ):
        return None
    place = {"partition": partition, "offset": offset} if offset >= 0 else {}
    ids = [*(entry.ids if entry is not None else ()), event.event_id][-KEPT_IDS:]
    if entry is not None and isinstance(event, Succeeded) and event.duplicate and entry.state == "succeeded":
        return entry.model_copy(update={"events": entry.events + 1, "ids": ids, **place})
    if entry is None or (event.type == "accepted" and entry.ended):
        # A request's first event, or a request ended and accepted again (its id used again, or its request
        # redelivered): its state starts again from this event. Its latest events stay for the fleet's folds (an earlier
        # success's duration is still a duration), each replaced as this run's come.
        entry = TableEntry(
            request_id=request_id,
            state="queued",
            host=event.host,
            attempt=event.attempt,
            since=event.time,
            last=event.time,
            latest=event.type,
            detail="",
            events=0,
            recent=entry.recent if entry is not None else [],
            earlier=entry.earlier if entry is not None else [],
        )
    method = event.method if isinstance(event, Accepted | Started | Succeeded) else entry.method
    return entry.model_copy(
        update={
            "state": STATE_AFTER[event.type],
            "method": method,
            "host": event.host,
            "attempt": event.attempt,
            "last": event.time,
            "latest": event.type,
            "detail": detail(event),
            "events": entry.events + 1,
            **place,
            "recent": recent(entry.recent, event),
            "earlier": earlier(entry, event),
            "ids": ids,
        }
    )


def recent(events: list[Event], event: Event) -> list[Event]:
    """The latest event of each type with `event` taken in (`kept`), oldest first. A success answered again to a
    redelivery (`duplicate`) is a type of its own here: it ends its run (the fleet's folds free its slot), and it
    trained nothing, so it does not replace a success that did, whose duration the fleet's order reads."""
    return [*(each for each in events if _kind(each) != _kind(event)), kept(event)]


def kept(event: Event) -> Event:
    """An event as an entry keeps it: a success without what the fleet's folds never read (its files, versions and
    evaluation, its metrics but KEPT_METRICS), which made a success two thirds of an entry's bytes
    (benchmarks.fleet_scale); every other event whole. `adapterd get` shows a request's events from the events topic."""
    if not isinstance(event, Succeeded):
        return event
    metrics = {name: value for name, value in event.metrics.items() if name in KEPT_METRICS}
    return event.model_copy(update={"metrics": metrics, "files": [], "versions": {}, "evaluation": None})


def earlier(entry: TableEntry, event: Event) -> list[Event]:
    """The entry's earlier runs with `event` taken in: an `accepted` starts a run, so the run before it (its `accepted`,
    its `started` and its end, those of them after its `accepted`) joins them, the last EARLIER_RUNS runs kept. A run
    its host did not end (a host lost) has no end: the next `accepted` ends it, as the fleet's folds say."""
    if not isinstance(event, Accepted):
        return entry.earlier
    run: list[Event] = [each for each in entry.recent if each.type == "accepted"]
    if not run:
        return entry.earlier
    began = run[0].time.timestamp()
    started: list[Event] = [each for each in entry.recent if each.type == "started" and each.time.timestamp() >= began]
    ends: list[Event] = [each for each in entry.recent if each.type in RUN_ENDS and each.time.timestamp() >= began]
    run += started[-1:] + sorted(ends, key=lambda each: each.time.timestamp())[-1:]
    runs = [*_runs(entry.earlier), run][-EARLIER_RUNS:]
    return [each for one in runs for each in one]


def _runs(events: list[Event]) -> list[list[Event]]:
    """Earlier runs' events, one list a run (each begins with its `accepted`)."""
    runs: list[list[Event]] = []
    for each in events:
        if each.type == "accepted" or not runs:
            runs.append([])
        runs[-1].append(each)
    return runs


def _kind(event: Event) -> str:
    return "succeeded-duplicate" if isinstance(event, Succeeded) and event.duplicate else event.type


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
        if event.gpus is not None:  # type: ignore[union-attr]
            return f"{event.child}, {event.gpus} GPUs"  # type: ignore[union-attr]
        return f"slot {event.slot}"  # type: ignore[union-attr]
    if kind == "checkpoint":
        return f"checkpoint at step {event.step}"  # type: ignore[union-attr]
    if kind == "cancelled":
        return event.reason  # type: ignore[union-attr]
    if kind == "queued":
        eta = f", ETA {event.eta_s:.0f} s" if event.eta_s is not None else ""  # type: ignore[union-attr]
        return f"{event.priority_class}/{event.team}: place {event.place}{eta}"  # type: ignore[union-attr]
    if kind == "waiting":
        if event.engine is not None:  # type: ignore[union-attr]
            return f"waits: {event.engine}"  # type: ignore[union-attr]
        return f"waits for {', '.join(event.after)}"  # type: ignore[union-attr]
    if kind == "preempted":
        return f"preempted by {event.by} at step {event.step} ({event.preemptions}x); waits again"  # type: ignore[union-attr]
    if kind == "held":
        return f"held: {event.reason}"  # type: ignore[union-attr]
    if kind == "paused":
        kept = event.resume_from_step  # type: ignore[union-attr]
        resumes = "starts over" if kept is None else f"resumes from step {kept}"
        return f"paused at step {event.stopped_at_step}: {event.reason}; held, {resumes}"  # type: ignore[union-attr]
    if kind == "released":
        return f"released: {event.reason}"  # type: ignore[union-attr]
    return ""
