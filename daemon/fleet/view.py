"""The fleet as this host sees it: each team's recent slot-time, the jobs running on every host, and how long jobs
of each method and model took; and the decisions taken with it.

The events are the fleet's only shared record of who ran what (no coordination service): every host
folds the same verified events (schemas.signing: an unsigned or forged event is not counted; settings
refuse priority classes without keys), each `event_id` once (daemon/kafka/event_ids.py: a genuine event
written again is not counted again), into `Usage`, `Occupancy` and `Durations` (daemon/fleet/policy/usage.py,
running.py); an event older than `USAGE_LOOKBACK_S` is not folded.

A daemon does not read those hours of events to start deciding: it loads the table of requests (daemon/table/:
each request's state, kept from the events by the keepers), its entries verified and parsed in worker threads by the
table's reader, and folds each entry's `recent` events (its latest of each type) of the window in a worker thread
(`Folds.load`); then the events past the keepers' committed offsets (the tail; in a partition they committed none of,
those of the window), each poll's records verified and folded in worker threads into those folds (`Folds.taken`),
which the loop then takes whole (`FleetView.adopt`) and sets `caught_up`; then it follows the events on from there,
each poll's records verified in worker threads and folded on the loop. So nothing on the loop grows with the topic or
the table, and a restarted daemon decides with a whole view once the table and its tail are read. What the table
cannot say exactly is said at `Folds`.

The decisions are the pure rules of daemon/fleet/policy/order.py, with what this host knows of its own requests before
their events are read back (`held`: its claims, its freed slots, the ends it sent), so that a slot it frees is never
given by a stale count of its own.
"""

from __future__ import annotations

import asyncio
import copy
import heapq
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import structlog

from daemon import executors
from daemon.executors import run_chunks
from daemon.fleet.policy.after import Latest
from daemon.fleet.policy.drain import backfills, drain
from daemon.fleet.policy.eta import Bounds, places
from daemon.fleet.policy.kinds import slot_kinds
from daemon.fleet.policy.order import FleetJob, FleetRequest, Standing, paced, pick, remaining_work, victim
from daemon.fleet.policy.running import Occupancy
from daemon.fleet.policy.telling import Telling
from daemon.fleet.policy.usage import ENDS, Durations, Switches, Usage
from daemon.kafka.event_ids import EventIds
from daemon.kafka.event_reader import checked
from daemon.kafka.records import Record
from daemon.kafka.topic_reader import TopicReader
from daemon.ops.heap import full_collections_held
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys
from daemon.table.entry import TableEntry
from daemon.table.reader import read_table
from schemas import Accepted, Event, Queued
from schemas.events import EventBase
from schemas.signing import UnverifiedEvent

log = structlog.get_logger()

USAGE_LOOKBACK_S = 4 * 3600.0  # the events folded: four half-lives of the fair share's memory
HALF_LIFE_S = 3600.0  # slot-time an hour old counts half
FOLLOW_AGAIN_S = 5.0
CLOCKS_S = 60.0  # the events of a partition with no table read from this much before the window: hosts' clocks differ


class Folds:
    """What the view folds of the fleet's events, and only that: `Usage`, `Durations`, `Occupancy`, `Switches`, each
    host's slots and what each waiting request was told, with the ids of the events folded (each once, none older than
    `USAGE_LOOKBACK_S`: daemon/kafka/event_ids.py) and the events not folded, by why. Pure: no Kafka, no clock.

    Made from the table (`load`: each entry's `recent` events within the window, every entry's merged in time order)
    and the events past it (`tail`), it says for the decisions what folding every event of the window says, except
    where the table keeps less: an entry keeps the latest event of each type of its request and its earlier runs'
    `accepted`, `started` and end (daemon/table/entry.py `folded`, the last EARLIER_RUNS of them), so of a request
    that ran more than EARLIER_RUNS + 1 times within the window the oldest runs' slot-time is not counted; a host whose
    only `accepted` of the window was its request's earlier one is not among `host_slots`; a running job's pace is its
    latest `progress` event's (an earlier one's, where the latest has no ETA, is not kept). The tail is folded event by
    event: exact."""

    def __init__(self) -> None:
        self.usage = Usage(HALF_LIFE_S)
        self.durations = Durations()
        self.running_jobs = Occupancy()
        self.switches = Switches()  # a preemption's seconds from the victim's stop to the new job's start
        self.host_slots: dict[str, int] = {}  # each host's slots, as its last `accepted` said
        self.host_kinds: dict[str, str | None] = {}  # and the kind of its GPUs (daemon/fleet/policy/kinds.py)
        self.telling = Telling()  # what each waiting request was last told by a `queued` event, of any host
        self.ids = EventIds(USAGE_LOOKBACK_S)  # the events folded: each once, none older than the window
        self.skipped: Counter[str] = Counter()  # events not folded since the last read from scratch, by why
        self.changes = 0  # events folded so far: a decision taken on the same count saw the same folds
        # Each request of the table: the events topic's partition and offset of the latest event its entry holds. An
        # event of the tail at or before it is in the entry already (the keepers write entries before they commit).
        self.tabled: dict[str, tuple[int, int]] = {}
        self.latest = (
            Latest()
        )  # each request's latest event type: what `after` waits for (daemon/fleet/policy/after.py)

    def observe(self, event: Event, now: float) -> None:
        self.changes += 1
        for fold in (self.usage, self.durations, self.running_jobs, self.switches):
            fold.observe(event, now)
        self.latest.observe(event)
        if isinstance(event, Accepted) and event.host_slots is not None:
            self.host_slots[event.host] = event.host_slots
            self.host_kinds[event.host] = event.gpu_kind
        elif isinstance(event, Queued) and event.request_id is not None:
            self.telling.heard(event.request_id, event.place, event.eta_s, event.time.timestamp(), event.host)
        if isinstance(event, Accepted) and event.request_id is not None:
            self.telling.started(event.request_id)

    def fold(self, event: Event, now: float) -> str | None:
        """Fold a verified event unless it was folded already or is older than the window; else why not (counted)."""
        refused = self.ids.refused(event, now)
        if refused is not None:
            self.skipped[refused] += 1
            return refused
        self.observe(event, now)
        return None

    def load(self, entries: Iterable[TableEntry], now: float) -> None:
        """Fold the table's entries (verified): each one's `recent` events of the window, every entry's merged in
        time order, each request's in its own order (the order they were folded in: a host's clock running behind
        another's does not put a request's `accepted` after its end). Older events are left out, not counted."""
        start, recents = now - USAGE_LOOKBACK_S, []
        for entry in entries:
            if entry.partition >= 0:
                self.tabled[entry.request_id] = (entry.partition, entry.offset)
            # Its earlier runs first (their `accepted`, `started` and end), then its latest events, each once.
            ran = {event.event_id for event in entry.earlier}
            events = [*entry.earlier, *(event for event in entry.recent if event.event_id not in ran)]
            recent = [event for event in events if event.time.timestamp() >= start]
            if recent:
                recents.append(recent)
        # By the time as a number: a (trusted) event's time without a zone is not comparable with one with a zone.
        for event in heapq.merge(*recents, key=lambda event: event.time.timestamp()):
            self.fold(event, now)

    def tail(self, event: Event, partition: int, offset: int, now: float) -> str | None:
        """Fold a verified event of the events topic read past the table (`load`), unless its request's entry holds it
        already (at or before the entry's place in the same partition, as daemon/table/entry.py `folded` says); else
        why not."""
        place = self.tabled.get(event.request_id or "")
        if place is not None and partition == place[0] and 0 <= offset <= place[1]:
            self.skipped["tabled"] += 1
            return "tabled"
        return self.fold(event, now)

    def take(self, record: Record, event: Event | UnverifiedEvent | ValueError, now: float) -> str | None:
        """Fold one record of the events topic as a worker thread found it (daemon/kafka/event_reader.py `checked`): its
        event when verified and not folded before (`tail`); else why not, counted."""
        if isinstance(event, UnverifiedEvent):
            self.skipped[event.reason] += 1
            return event.reason
        if isinstance(event, ValueError):
            self.skipped["not_an_event"] += 1
            return "not_an_event"
        return self.tail(event, record.partition, record.offset, now)

    def taken(
        self, records: Sequence[Record], found: Sequence[Event | UnverifiedEvent | ValueError], now: float
    ) -> None:
        """`take` of each record of a batch, in order (what a worker thread does with folds not yet in use)."""
        for record, event in zip(records, found, strict=True):
            self.take(record, event, now)


def loaded(entries: Iterable[TableEntry], now: float) -> Folds:
    """The folds of the table's entries (`Folds.load`), made afresh: a worker thread's work for `FleetView.adopt`."""
    folds = Folds()
    folds.load(entries, now)
    return folds


class FleetView(Folds):
    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.caught_up = asyncio.Event()  # set once the table and the events up to the start have been folded
        # The ends this host published (event id → request id), until this view reads them back: the job holds no slot
        # from when its end is sent, whatever the events read so far say (`held`). Kept beside the folds, not folded in:
        # an end folded before the stream reads its job's `accepted` (a stream behind, or read again from scratch) would
        # be refused as repeated when read, and the `accepted` read after it would hold a slot for ever.
        self.ended_here: dict[str, str] = {}
        self.drained_for: str | None = (
            None  # the request this host last drained for (daemon/fleet/policy/drain.py), for its log line
        )

    def observe(self, event: Event, now: float) -> None:
        self.ended_here.pop(event.event_id, None)  # read back: the folds say it now
        super().observe(event, now)

    def sending(self, event: EventBase) -> None:
        """An event this host is about to publish (`Publisher.watchers`): an end is counted at once (`held`)."""
        if isinstance(event, ENDS) and event.request_id is not None:
            self.ended_here[event.event_id] = event.request_id
            self.changes += 1

    def held(self, mine: Mapping[str, tuple[str, int]]) -> dict[str, int]:
        """The slots each team holds now: the events' count, with this host's own requests as it knows them (`mine`,
        by request id: (team, slots) of its claims and jobs; `Usage.running`) and its ends not yet read back as none."""
        return self.usage.running({**dict.fromkeys(self.ended_here.values(), ("", 0)), **mine})

    def startable_elsewhere(self, host: str, head: FleetRequest, *, on_ray: bool = False) -> bool:
        """Whether another host than `host` could start `head` now, as the events say: it has a free slot (its slots,
        from its last `accepted`, above the GPUs of the jobs it runs there: a job on Ray holds none of them), or runs a
        job `head` may preempt now (`victim`, every job of a preemptible class taken to be at a step it can stop, as
        `_preempted` takes them). `on_ray`: `head` is bigger than a host and goes to a Ray cluster, where only stopping
        a job on Ray makes room that the events show (a host's free Ray slots they do not say). Not exact (a host gone
        away still counts its slots for `USAGE_LOOKBACK_S`, a slot freed before its job's outcome is published counts
        as held); it decides only whether a full host leaves a class's queue to the hosts that can start its requests
        now (daemon/fleet/dispatcher.py `_reads_while_full`)."""
        now, settings = time.time(), self.settings
        others = [job for job in self.running_jobs.jobs(now) if job.host != host]
        used: Counter[str] = Counter()
        for job in others:
            used[job.host] += 0 if job.on_ray else job.gpus
        if not on_ray and any(slots > used[name] for name, slots in self.host_slots.items() if name != host):
            return True
        stoppable = [replace(job, preemptible=True) for job in others if job.on_ray == on_ray]
        return (
            victim(
                head,
                stoppable,
                settings.priority_classes,
                settings.preempt_min_run_s,
                settings.preempt_max_count,
                now,
                free=head.gpus if on_ray else 0,  # a job on Ray frees a Ray slot, whatever its GPUs
            )
            is not None
        )

    def fleet_slots(self, free_here: int, running: Sequence[FleetJob] | None = None) -> int:
        """The fleet's slots, as the hosts' `accepted` events said them, or failing that the slots of the jobs running
        on it (`running`, else the events') plus this host's free ones."""
        jobs = self.running_jobs.jobs(time.time()) if running is None else running
        return sum(self.host_slots.values()) or max(1, sum(job.gpus for job in jobs if not job.on_ray) + free_here)

    async def follow(self) -> None:
        """Load the view from the table and the events past it, then fold every verified event after, for as long as
        the daemon runs; loaded again from scratch after the brokers fail it (made afresh and taken whole: an event is
        never counted twice, and the decisions meanwhile read what was folded before)."""
        while True:
            try:
                await self._follow()
            except Exception as exc:  # the brokers away: decisions go on with what was folded, until read again
                log.warning("fleet.usage_unread", error=f"{type(exc).__name__}: {exc}")
                await asyncio.sleep(FOLLOW_AGAIN_S)

    async def _follow(self) -> None:
        keys = event_keys(self.settings)
        with full_collections_held():
            # The table's entries, verified and read as their heads in worker threads (daemon/table/reader.py), then
            # parsed whole one at a time and folded, in one: 22,605 entries parsed whole at once were two million
            # objects, whose freeing held the loop 0.5 s and whose full collection as long.
            table = await read_table(self.settings, tail=False, heads=True)
            folds = await executors.run("verify", loaded, table.whole(), time.time())
            requests, refused, tail_from = len(table.listed()), dict(table.refused), table.events_from
            del table
        # The events past the keepers' committed offsets (in a partition they committed none of, those of the window):
        # each poll's verified, then folded, in worker threads, into the folds not yet taken; then taken whole.
        reader = TopicReader(
            self.settings,
            self.settings.events_topic,
            start_at=tail_from,
            since=time.time() - USAGE_LOOKBACK_S - CLOCKS_S,
        )
        async with reader:
            with full_collections_held():
                began = {tp.partition: offset for tp, offset in reader.next_offset.items()}
                async for batch in reader.batches(follow=False):
                    found = await run_chunks("verify", partial(checked, keys=keys), batch)
                    await executors.run("verify", folds.taken, batch, found, time.time())
                self.adopt(folds)
                del folds
            self.caught_up.set()
            log.info(
                "fleet.usage_read",
                teams=sorted(self.usage.slot_seconds(time.time())),
                requests=requests,
                refused=refused,
                tail_from=began,
                tail_to={tp.partition: end for tp, end in reader.ends.items()},
                skipped=dict(self.skipped),
            )
            # Then on from there: each poll's records verified in worker threads, and folded here.
            async for batch in reader.batches():
                found = await run_chunks("verify", partial(checked, keys=keys), batch)
                now = time.time()
                for record, event in zip(batch, found, strict=True):
                    self.take(record, event, now)

    def adopt(self, folds: Folds) -> None:
        """Take folds made afresh (`loaded`, off the loop) in place of these. What each waiting request was told is
        kept where this host told it later; this host's ends are forgotten where the folds hold them (read back)."""
        self.usage, self.durations, self.running_jobs, self.switches = (
            folds.usage,
            folds.durations,
            folds.running_jobs,
            folds.switches,
        )
        self.host_slots, self.ids, self.skipped, self.tabled = folds.host_slots, folds.ids, folds.skipped, folds.tabled
        self.latest = folds.latest
        self.host_kinds = folds.host_kinds
        self.changes += folds.changes + 1
        for request_id, told in folds.telling.told.items():
            self.telling.heard(request_id, told.place, told.eta_s, told.at, told.host)
        for event_id in [event_id for event_id in self.ended_here if event_id in folds.ids]:
            del self.ended_here[event_id]

    def take(self, record: Record, event: Event | UnverifiedEvent | ValueError, now: float) -> str | None:
        """`Folds.take`, the first event not folded for each reason logged at once, the counts with `fleet.usage_read`
        (a flood of forged events is one line per reason, not one per event)."""
        reason = super().take(record, event, now)
        if reason is not None and self.skipped[reason] == 1:
            log.warning("fleet.event_skipped", reason=reason, partition=record.partition, offset=record.offset)
        return reason

    def pick(
        self,
        heads: Sequence[FleetRequest],
        free: int | None,
        mine: Mapping[str, tuple[str, int]] | None = None,
        *,
        here: Sequence[FleetJob] | None = None,
        slots: int | None = None,
    ) -> FleetRequest | None:
        """What one of this host's `free` slots takes among the heads it holds (None: whatever their GPUs), the teams'
        caps read with this host's own claims and jobs as it knows them (`held`). Given `here` (those jobs and claims)
        and `slots` (all of this host's), a host drained for a request of several GPUs first in the order takes only
        what backfills its drain (daemon/fleet/policy/drain.py)."""
        now = time.time()
        running = self.running_jobs.jobs(now)
        pace = paced(self.durations, running)
        settings = self.settings
        standing = Standing(
            settings.priority_classes,
            settings.teams,
            self.usage.slot_seconds(now),
            self.held(mine or {}),
            remaining_work(running, pace, now),
            pace,
        )
        candidates = list(heads)
        if free is not None and here is not None and slots is not None:
            first = pick(candidates, standing)
            reserved = drain(first, free, slots, here, pace, now, settings.reserve_after_s)
            if reserved is not None:
                candidates = [head for head in candidates if backfills(head, reserved, pace, now)]
                if reserved.head.request_id != self.drained_for:  # said once a reservation, not every turn
                    log.info(
                        "fleet.drained",
                        request_id=reserved.head.request_id,
                        gpus=reserved.head.gpus,
                        free_slots=free,
                        due_s=None if reserved.due == float("inf") else round(reserved.due - now, 1),
                    )
            self.drained_for = None if reserved is None else reserved.head.request_id
        return pick(candidates, standing, free=free)

    def victim(self, head: FleetRequest, mine: list[FleetJob], free: int, *, ever: bool = False) -> FleetJob | None:
        """Which of this host's running jobs `head` may preempt (`ever`: now or once it has run `preempt_min_run_s`)."""
        settings = self.settings
        min_run_s = 0.0 if ever else settings.preempt_min_run_s
        return victim(
            head, mine, settings.priority_classes, min_run_s, settings.preempt_max_count, time.time(), free=free
        )

    def places(
        self, waiting: Sequence[FleetRequest], free: int, here: Sequence[FleetJob] | None = None
    ) -> list[tuple[FleetRequest, int, float | None]]:
        """Each waiting request with its place in the order they are expected to start and its ETA (seconds), as far as
        this host sees the fleet (`fleet_slots`, by kind where the hosts said their GPUs' kinds): the preemptions the
        order will make first (daemon/fleet/policy/eta.py `preempting`, within the operator's bounds and after the
        measured switch), then list scheduling of the rest (`etas`, each team held to its cap), placed by their starts
        (`ranked`). `here`: this host's jobs and claims as it knows them now, in place of what the events say of this
        host (a slot it just gave is not free for the ETA of the request behind: told 0 s, it waited a whole job)."""
        return places(list(waiting), *self._placing(free, here, copied=False))

    async def places_beside(
        self, waiting: Sequence[FleetRequest], free: int, here: Sequence[FleetJob] | None = None
    ) -> list[tuple[FleetRequest, int, float | None]]:
        """`places`, worked out in the `order` pool's thread on a copy of what it reads: the announcer's 10,000 waiting
        requests took the loop half a second (benchmarks.fleet_scale), and the loop goes on folding events meanwhile."""
        return await executors.run("order", places, list(waiting), *self._placing(free, here, copied=True))

    def _placing(self, free: int, here: Sequence[FleetJob] | None, *, copied: bool) -> tuple[Any, ...]:
        """What `eta.places` reads besides the waiting requests, now (`copied`: the durations copied, as the loop folds
        into them while a thread reads them)."""
        now = time.time()
        running = self.running_jobs.jobs(now)
        if here is not None:
            gone = {*self.ended_here.values(), *(job.request_id for job in here)}
            running = [job for job in running if job.host != self.settings.host and job.request_id not in gone] + list(
                here
            )
        durations = copy.deepcopy(self.durations) if copied else self.durations
        pace = paced(durations, running)  # one reading of a step's pace for the order, the preemptions and the ETAs
        settings = self.settings
        bounds = Bounds(
            settings.priority_classes, settings.preempt_min_run_s, settings.preempt_max_count, self.switches.seconds()
        )
        return (
            self.usage.slot_seconds(now),
            running,
            self.fleet_slots(free, running),
            bounds,
            pace,
            now,
            settings.teams,
            slot_kinds(self.host_slots, self.host_kinds, settings.gpu_kinds),
            max(self.host_slots.values(), default=None),
        )
