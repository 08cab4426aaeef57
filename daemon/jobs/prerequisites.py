"""Requests that wait for others (`after`, issue 63): whether a request reached may start, must wait, or ends.

When the scheduler reaches a request with `after`, each id it names is read by its key from the table of requests, as
`adapterd get` reads one (daemon/table/reader.py `read_request`: one partition of the state topic and the events past
its entry, so as current as the events topic): at most MAX_AFTER reads, each bounded by one request's events.

- Every one succeeded: it starts. Its `start_from`'s `succeeded` says where the artifact is (the Hub repo at its
  commit, or the local sink's folder), handed to its child as the job spec's `start` (handlers/toolkit/start_from.py).
  A `start_from` whose success published elsewhere than its requested revision (a gate that failed: a pull request,
  a side branch, nothing) leaves nothing to start from: the request ends failed, as below.
- One failed, was cancelled or was rejected: the request ends `failed` (`prerequisite_failed`, stage `intake`, the
  message naming which and why), committed, nothing trained.
- Otherwise it waits, blocking nothing behind it, as a retry not yet due does (daemon/jobs/waiting_retries.py): with
  requests behind it, it goes behind them (a copy at the end of its partition, byte for byte, committed), at most
  once every `recheck_s` for one request (two waiting requests in one partition would otherwise pass each other at
  the broker's pace); else its partition is held at it and read again `recheck_s` later (`due`, which the scheduler's
  `wake` asks each turn). So it is read again, and its prerequisites looked up again, at least every `recheck_s`.
  A waiting request publishes `waiting` (not terminal) naming the ids it waits for, once for each set of them, so
  `adapterd jobs` and `get` say what it waits for.
- The table cannot be read (the brokers away): it waits as above, and is looked at again.
- An id the fleet has never heard of (no entry, no event): a pipeline publishes its first request and the next one at
  once, and without priority classes a request has no event until a host starts it (it may wait behind a long job in
  its partition). So an unknown id is waited for like one queued, for `unknown_wait_s` after this host first read the
  request (held in memory: a restart or a move to another host begins the wait again, which errs towards waiting);
  past that the request is rejected, naming `after`: an id mistyped ends the request within a bounded time, an id
  merely slow to be read does not, unless it stays unheard of that long.

Cycles: a request cannot name itself (schemas/chains.py, rejected at decoding). Requests that wait for each other in
a ring (a for b, b for c, c for a): each reached first waits (the next unknown, or queued), publishing its `waiting`;
the last one reached follows the waits of its prerequisites through their `waiting` events (`_cycle`, at most
MAX_CYCLE_LOOKUPS ids beyond its own), finds its way back to itself and ends failed (`prerequisite_failed`, "a
cycle", naming the ring), and the others then end failed for it. A ring longer than the bound waits, each of its
requests saying in `adapterd jobs` what it waits for, until one is cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import structlog
from aiokafka import TopicPartition

from daemon.errors import PushFailed
from daemon.hub.local_sink import published_folder
from daemon.job.events import JobEvents
from daemon.jobs.offered import Offered
from daemon.kafka.partitions import Partitions
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.ops import metrics
from daemon.resources.shards import Unfit
from daemon.settings import Settings
from handlers.protocol import StartPoint
from schemas import Failed, RequestBase
from schemas.common import FieldError
from schemas.decode import Rejection
from schemas.events import Succeeded, Waiting

log = structlog.get_logger()

RECHECK_S = 5.0  # how often a waiting request's prerequisites are looked up again, at most
MAX_CYCLE_LOOKUPS = 64  # the most ids looked up beyond a request's own `after` to find a cycle of waits through them
UNKNOWN_WAIT_S = 3600.0  # how long an id no host has heard of is waited for before the request is rejected
CODE = "prerequisite_failed"


@dataclass(frozen=True)
class Known:
    """What the fleet says of one prerequisite: its state (None: never heard of), its latest event's line, its success,
    and, while it waits, the ids it waits for."""

    state: str | None
    detail: str = ""
    succeeded: Succeeded | None = None
    waits_for: tuple[str, ...] = ()


Lookup = Callable[[str], Awaitable[Known]]


class PrerequisiteRefused(Unfit):
    """A request naming an id the fleet has not heard of for `unknown_wait_s`: intake rejects it, as it rejects every
    `Unfit` (daemon/intake.py), naming `after`."""


@dataclass
class _Held:
    offset: int
    due: float


@dataclass
class Prerequisites:
    """The requests with `after` this host has reached: where each waits, and what each starts from."""

    settings: Settings
    publisher: Publisher
    partitions: Partitions
    lookup: Lookup | None = None  # by default the table of requests (`table_lookup`); a test's own
    clock: Callable[[], float] = time.time
    recheck_s: float = RECHECK_S
    unknown_wait_s: float = UNKNOWN_WAIT_S
    held: dict[TopicPartition, _Held] = field(default_factory=dict)
    starts: dict[str, StartPoint] = field(default_factory=dict)  # request id → its start, until its job starts
    first_read: dict[str, float] = field(default_factory=dict)  # request id → when this host first read it waiting
    deferred_at: dict[str, float] = field(default_factory=dict)  # request id → when it last went behind others
    told: dict[str, tuple[str, ...]] = field(default_factory=dict)  # request id → the ids its last `waiting` named

    def __contains__(self, tp: TopicPartition) -> bool:
        return tp in self.held

    async def offer(self, tp: TopicPartition, record: Record, request: RequestBase, attempt: int) -> Offered | None:
        """None when `request` may start (its start, if any, kept for `start_of`); else what became of it: ended
        (`SKIPPED`), gone behind the requests after it (`DEFERRED`) or its partition held at it (`WAITING`)."""
        if not request.after:
            return None
        lookup = self.lookup if self.lookup is not None else self._table_lookup
        try:
            answers = await asyncio.gather(*(lookup(each) for each in request.after))
        except Exception as exc:  # the brokers away, a topic missing: not the request's fault, so it waits, not ends
            log.warning("request.prerequisites_unread", request_id=request.request_id, error=repr(exc))
            return await self._wait(tp, record, request, self.clock())
        known = dict(zip(request.after, answers, strict=True))
        try:
            cycle = await _cycle(request.request_id, known, lookup)
        except Exception as exc:  # as above: a lookup that fails leaves the request waiting
            log.warning("request.prerequisites_unread", request_id=request.request_id, error=repr(exc))
            return await self._wait(tp, record, request, self.clock())
        ended = cycle or _ended(request, known)
        if ended is not None:
            await self._end(tp, record, request, attempt, ended)
            return Offered.SKIPPED
        waits_for = tuple(each for each, one in known.items() if one.state != "succeeded")
        now = self.clock()
        if not waits_for:
            self._forget(request.request_id)
            if request.start_from is not None:
                try:
                    start = _start_point(request.start_from, known[request.start_from], self.settings)
                except PushFailed as exc:  # a repo id with no folder of its own in the local sink
                    await self._end(tp, record, request, attempt, f"start_from: {request.start_from}: {exc}"[:1000])
                    return Offered.SKIPPED
                self.starts[request.request_id] = start
            return None
        first = self.first_read.setdefault(request.request_id, now)
        unknown = [each for each in waits_for if known[each].state is None]
        if unknown and now - first >= self.unknown_wait_s:
            self._forget(request.request_id)
            raise PrerequisiteRefused(
                Rejection(
                    "invalid",
                    [
                        FieldError(
                            path="after",
                            message=f"{', '.join(unknown)}: no such request known to the fleet (no entry in the table "
                            f"of requests, no event) after {self.unknown_wait_s:.0f} s",
                        )
                    ],
                    request.request_id,
                )
            )
        await self._tell(request, record, attempt, waits_for)
        return await self._wait(tp, record, request, now)

    def start_of(self, request: RequestBase) -> StartPoint | None:
        """What the request's job starts from (taken once: its job is starting)."""
        return self.starts.pop(request.request_id, None)

    def due(self) -> list[TopicPartition]:
        """The partitions held at a waiting request whose time to look again has come: no longer held here."""
        now = self.clock()
        ready = [tp for tp, held in self.held.items() if now >= held.due]
        for tp in ready:
            del self.held[tp]
        return ready

    def forget(self, tp: TopicPartition) -> None:
        self.held.pop(tp, None)

    def forget_all(self) -> None:
        """After a rebalance: the partitions start again at their committed offsets, read anew."""
        self.held.clear()

    async def _wait(self, tp: TopicPartition, record: Record, request: RequestBase, now: float) -> Offered:
        rid = request.request_id
        behind = self.partitions.highwater(tp) > record.offset + 1
        if behind and now - self.deferred_at.get(rid, -self.recheck_s) >= self.recheck_s:
            # Requests stand behind it: it goes behind them, byte for byte, and they go first.
            await self.publisher.deliver(self.publisher.deferred_copy(record))
            await self.partitions.commit(tp, record.offset + 1)
            self.deferred_at[rid] = now
            log.info("request.waits_behind", request_id=rid, partition=tp.partition, offset=record.offset)
            return Offered.DEFERRED
        self.partitions.hold(tp, record.offset)
        self.held[tp] = _Held(record.offset, now + self.recheck_s)
        return Offered.WAITING

    async def _tell(self, request: RequestBase, record: Record, attempt: int, waits_for: tuple[str, ...]) -> None:
        """Its `waiting` event, when what it waits for changed since it was last told (or this host never told it)."""
        if self.told.get(request.request_id) == waits_for:
            return
        self.told[request.request_id] = waits_for
        log.info("request.waiting", request_id=request.request_id, waits_for=list(waits_for))
        events = JobEvents.for_record(self.publisher, request, self.settings.host, attempt, record)
        await events.publish(Waiting, after=list(waits_for))

    async def _end(self, tp: TopicPartition, record: Record, request: RequestBase, attempt: int, why: str) -> None:
        self._forget(request.request_id)
        log.info("request.prerequisite_failed", request_id=request.request_id, reason=why)
        events = JobEvents.for_record(self.publisher, request, self.settings.host, attempt, record)
        await events.publish(Failed, code=CODE, message=why, stage="intake", retryable=False)
        metrics.JOBS.labels("failed").inc()
        await self.partitions.commit(tp, record.offset + 1)

    def _forget(self, request_id: str) -> None:
        for kept in (self.first_read, self.deferred_at, self.told):
            kept.pop(request_id, None)

    async def _table_lookup(self, request_id: str) -> Known:
        from daemon.table.reader import read_request  # the table's reader, only where a request has `after`

        read = await read_request(self.settings, request_id)
        return known_of(read.entries.get(request_id))


def known_of(entry: object) -> Known:
    """A table entry (daemon/table/entry.py `TableEntry`, or None) as `Known`."""
    from daemon.table.entry import TableEntry

    if not isinstance(entry, TableEntry):
        return Known(None)
    succeeded = next((each for each in reversed(entry.recent) if isinstance(each, Succeeded)), None)
    waiting = next((each for each in reversed(entry.recent) if isinstance(each, Waiting)), None)
    waits_for = tuple(waiting.after) if waiting is not None and entry.latest == "waiting" else ()
    return Known(entry.state, entry.detail, succeeded if entry.state == "succeeded" else None, waits_for)


async def _cycle(request_id: str, known: dict[str, Known], lookup: Lookup) -> str | None:
    """A chain of waits from the request's prerequisites back to it (a waits for b, b for c, c for a), followed through
    each waiting request's `waiting` event (`Known.waits_for`), looking up at most MAX_CYCLE_LOOKUPS more ids: the
    message that ends it, naming the chain, or None. A cycle longer than the bound waits, each of its requests saying
    what it waits for, until one is cancelled."""
    paths = {each: [each] for each in known}
    frontier = list(known.items())
    looked_up = 0
    while frontier:
        each, one = frontier.pop(0)
        for following in one.waits_for:
            path = [*paths[each], following]
            if following == request_id:
                return f"after: {' waits for '.join([request_id, *path])}: a cycle, none of them can start"
            if following in paths or looked_up >= MAX_CYCLE_LOOKUPS:
                continue
            looked_up += 1
            paths[following] = path
            frontier.append((following, await lookup(following)))
    return None


def _ended(request: RequestBase, known: dict[str, Known]) -> str | None:
    """Why the request ends without starting (a message naming the prerequisite), or None."""
    for each, one in known.items():
        if one.state in ("failed", "cancelled", "rejected"):
            return f"after: {each} {one.state}: {one.detail}"[:1000]
    start = request.start_from
    done = known[start].succeeded if start is not None else None
    if start is not None and known[start].state == "succeeded" and done is None:
        return (
            f"start_from: {start} succeeded, and its `succeeded` event, which says where its artifact is, is not kept"
        )
    if done is not None and done.published != "main":
        return (
            f"start_from: {start} succeeded but published {done.published!r}, not to its requested revision "
            f"({done.repo_id}@{done.revision}): there is nothing to start from"
        )
    return None


def _start_point(request_id: str, known: Known, settings: Settings) -> StartPoint:
    done = known.succeeded
    assert done is not None  # succeeded, by the caller
    # The local sink's folder of that repo on this host, from its id: never the event's `location`, a path any writer
    # of the events topic could name (the child checks the folder is there: handlers/toolkit/start_from.py).
    folder = published_folder(done.repo_id, settings) if done.sink == "local" else None
    return StartPoint(request_id=request_id, repo_id=done.repo_id, commit_sha=done.commit_sha, folder=folder)
