"""Each waiting request's place in the fleet's order and its ETA, as `adapterd jobs --state queued`
and `adapterd get` show them: one function, `place_and_eta`, on the fleet's own rules.

The events are folded as every host folds them (daemon/fleet/policy/usage.py `Usage`, `Durations` and `Switches`,
daemon/fleet/policy/running.py `Occupancy`): the events of the table of requests, each entry's latest event of each
type (daemon/table/reader.py `TableRead.recent`), as the fleet's view takes them from the table; the places
and ETAs are daemon/fleet/policy/eta.py `places`, as a host tells them in its `queued` events (the order they are
expected to start in: class, then the teams' fair share, then arrival, each team held to its cap; the
preemptions within the operator's bounds; list scheduling onto the fleet's slots, unknown rather than guessed
where a start needs an end nothing says). The one thing the CLI supplies is the number of the fleet's slots
(`--slots`, else `default_slots`, by the kind of their GPUs where the hosts said it: `slots_by_kind`, so a request
that asks for a kind is placed only on slots of a kind that serves it).

Without priority classes there is no fleet's order: each partition of the requests topic is a
first-in-first-out queue read one job at a time, so a request's place is its place in its partition
and its ETA the same list scheduling onto that partition alone (its running job, then those ahead).

A request whose latest event is `accepted` has a slot already and starts now: it is listed (the
events call it queued) without a place, and counts as a running job for everyone's ETA. A request with
a cancel sent and not yet honoured (daemon/cli/cancels_sent.py) is placed nowhere and counted in no
one's place: the host that reaches it skips it; the queue's table leaves it out and says how many.

Each place and ETA is worked out when the command runs, from the queues and the events; a `queued`
event's place and ETA were the publishing host's when it published it, so `get` shows only the fresh
one, and says when it was worked out.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from daemon.cli.cancels_sent import mark_sent, sent_control
from daemon.cli.listing import Column
from daemon.cli.waiting import Backlog, WaitingRequest, read_backlog
from daemon.fleet.policy import order as fleet
from daemon.fleet.policy.eta import Bounds, etas, places
from daemon.fleet.policy.kinds import SlotKinds, slot_kinds
from daemon.fleet.policy.running import Occupancy
from daemon.fleet.policy.usage import Durations, Pace, Switches, Usage
from daemon.settings import Settings
from daemon.table.reader import TableRead
from schemas import Event
from schemas.events import Accepted

RECENT_HOSTS = timedelta(hours=24)  # a host that started a job in this past counts for the default --slots
# Not in the order: a record that is not a request; a request that has its slot; one held or paused (its latest event
# says so: daemon/jobs/holds.py), which starts nowhere until released.
UNPLACED = ("undecodable", "accepted", "held", "paused")
PENDING_NAMED = 5  # the requests with a cancel pending named under the queue's table; the rest counted


@dataclass(frozen=True)
class Placed:
    """A waiting request, its place (1: next to start; None: not in the order) and its ETA in seconds."""

    request: WaitingRequest
    place: int | None
    eta_s: float | None
    of: int = 0  # how many are placed in the queue its place is in: the fleet's, or (without classes) its partition's

    def row(self) -> list[str]:
        """Its row of `adapterd jobs --state queued`' table (`COLUMNS`)."""
        w = self.request
        return [
            w.request_id,
            w.priority_class or "-",
            w.team,
            str(self.place or "-"),
            eta_text(self.eta_s),
            w.stage,
            w.method or "-",
            w.where + (f"  {w.detail}" if w.detail else ""),
        ]

    def document(self) -> dict[str, Any]:
        """What `adapterd jobs --state queued --json` gives of it, and `get --json` as `waiting` (`WAITING_FIELDS`)."""
        w = self.request
        return {
            "request_id": w.request_id,
            "state": "queued",
            "priority_class": w.priority_class,
            "team": w.team,
            "place": self.place,
            "of": self.of,
            "eta_s": self.eta_s,
            "stage": w.stage,
            "method": w.method,
            "model": w.model,
            "gpus": w.gpus,
            "where": w.where,
            "host": w.host,
            "arrived": w.arrived,
            "detail": w.detail,
            "after": w.after,
            "metadata": w.metadata,
            "cancel": None if w.cancel is None else {"sent": w.cancel.sent, "reason": w.cancel.reason},
        }


COLUMNS = (
    Column("REQUEST"),
    Column("CLASS"),
    Column("TEAM"),
    Column("PLACE", right=True),
    Column("ETA", right=True),
    Column("WAITING"),
    Column("METHOD"),
    Column("WHERE"),
)


def place_and_eta(
    waiting: list[WaitingRequest],
    events: list[Event],
    settings: Settings,
    slots: int,
    now: datetime,
    records: dict[str, WaitingRequest] | None = None,
    kinds: SlotKinds | None = None,
) -> list[Placed]:
    """The waiting requests in the fleet's order, each with its place and ETA; then those that have a slot
    (`accepted`: ETA 0) and the rest unplaced: records that are not requests, requests with a cancel pending
    and, without classes, requests no record says where they wait. `records`: every request read past the
    committed offsets, the running ones too (without classes, whose partition each running job holds). `kinds`: the
    fleet's slots by the kind of their GPUs (`slots_by_kind`), in place of `slots`, where its hosts said them."""
    at = now.timestamp()
    usage, durations, running, switches = Usage(), Durations(), Occupancy(), Switches()
    for event in events:
        for fold in (usage, durations, running, switches):
            fold.observe(event, at)
    jobs = running.jobs(at)
    pace = fleet.paced(durations, jobs)  # as the hosts read it (daemon/fleet/view.py)
    mine = {
        w.request_id: w
        for w in waiting
        if w.stage not in UNPLACED and w.cancel is None and (settings.priority_classes or w.at is not None)
    }
    if settings.priority_classes:
        bounds = Bounds(
            settings.priority_classes, settings.preempt_min_run_s, settings.preempt_max_count, switches.seconds()
        )
        found = places(
            [_in_order(w) for w in mine.values()],
            usage.slot_seconds(at),
            jobs,
            slots,
            bounds,
            pace,
            at,
            settings.teams,
            kinds,
            most_per_host(events, now),
        )
        placed = [Placed(mine[request.request_id], place, eta, len(found)) for request, place, eta in found]
    else:
        placed = _in_partitions(list(mine.values()), records or {}, jobs, pace, at)
    return placed + [
        Placed(w, None, 0.0 if w.stage == "accepted" and w.cancel is None else None)
        for w in waiting
        if w.request_id not in mine
    ]


def _in_order(w: WaitingRequest) -> fleet.FleetRequest:
    return fleet.FleetRequest(
        w.request_id,
        w.priority_class or "",
        w.team,
        w.arrived.timestamp(),
        w.method or "",
        w.model or "",
        w.gpus,
        steps=w.steps,
        need=w.need,
        hosts=w.hosts,
    )


def _in_partitions(
    waiting: list[WaitingRequest], records: dict[str, WaitingRequest], jobs: list[fleet.FleetJob], pace: Pace, at: float
) -> list[Placed]:
    """Without classes: each partition a queue of its own, in offset order, behind the job that holds it."""
    queues: dict[tuple[str, int], list[WaitingRequest]] = {}
    for w in sorted(waiting, key=lambda w: w.at or ("", 0, 0)):
        queues.setdefault((w.at or ("", 0, 0))[:2], []).append(w)
    running = {job.request_id for job in jobs}  # from its `accepted` on: the job a partition is paused for
    holding = {
        (r.at[0], r.at[1]): r.request_id for r in records.values() if r.at is not None and r.request_id in running
    }
    placed = []
    for partition, queue in queues.items():
        order = [_in_order(w) for w in queue]
        held = [job for job in jobs if job.request_id == holding.get(partition)]
        eta = etas(order, held, 1, pace, at)
        placed += [Placed(w, place, eta.get(w.request_id), len(queue)) for place, w in enumerate(queue, start=1)]
    return sorted(placed, key=lambda p: (p.eta_s is None, p.eta_s or 0.0, p.request.arrived))


def default_slots(events: list[Event], now: datetime) -> int:
    """The fleet's slots when --slots is not given: the hosts that started or accepted a job in the last 24 hours,
    each with as many slots as its latest `accepted` said (`host_slots`: a fleet host says
    it), else one (at least 1)."""
    slots: dict[str, int] = {}
    for event in events:
        if event.type in ("started", "accepted") and now - event.time <= RECENT_HOSTS:
            said = event.host_slots if isinstance(event, Accepted) else None
            slots[event.host] = said if said is not None else slots.get(event.host, 1)
    return max(1, sum(slots.values()))


def hosts_said(events: list[Event], now: datetime) -> tuple[dict[str, int], dict[str, str | None]]:
    """Each host that accepted a job in the last 24 hours: the slots and the kind of GPU its latest `accepted` said, as
    the hosts' fleet view keeps them (daemon/fleet/view.py `host_slots`, `host_kinds`)."""
    slots: dict[str, int] = {}
    kinds: dict[str, str | None] = {}
    for event in events:
        if isinstance(event, Accepted) and event.host_slots is not None and now - event.time <= RECENT_HOSTS:
            slots[event.host], kinds[event.host] = event.host_slots, event.gpu_kind
    return slots, kinds


def most_per_host(events: list[Event], now: datetime) -> int | None:
    """The most slots a host says it has (`hosts_said`); None when none said: a request asking more runs on a Ray
    cluster if anywhere, and gets no ETA from the fleet's slots."""
    return max(hosts_said(events, now)[0].values(), default=None)


def slots_by_kind(events: list[Event], now: datetime, settings: Settings) -> SlotKinds | None:
    """The fleet's slots by the kind of their GPUs, when its hosts said them (`hosts_said`,
    daemon/fleet/policy/kinds.py); None when none said a kind."""
    return slot_kinds(*hosts_said(events, now), settings.gpu_kinds)


def eta_text(eta_s: float | None) -> str:
    if eta_s is None:
        return "-"
    if eta_s < 90:
        return f"{eta_s:.0f}s"
    if eta_s < 5400:
        return f"{eta_s / 60:.0f}m"
    return f"{eta_s / 3600:.1f}h"


async def placed_backlog(
    settings: Settings, slots: int | None, now: datetime, table: TableRead | None = None
) -> tuple[Backlog, list[Placed]]:
    """Every waiting request (daemon/cli/waiting.py), those with a cancel pending marked, the others placed in the
    fleet's order with their ETAs (`table`: the table of requests, when read already)."""
    backlog = await read_backlog(settings, table)
    mark_sent(backlog.waiting, await sent_control(settings, now))
    # --slots given: the operator's count, of no kind; else the hosts' own, by kind where they said their GPUs'.
    kinds = None if slots else slots_by_kind(backlog.events, now, settings)
    return backlog, place_and_eta(
        backlog.waiting,
        backlog.events,
        settings,
        slots or default_slots(backlog.events, now),
        now,
        backlog.records,
        kinds,
    )


async def waiting_placed(settings: Settings, request_id: str, slots: int | None, now: datetime) -> Placed | None:
    """`adapterd get`'s request where it waits, placed (`where_it_waits` says it); None when it waits nowhere."""
    _, placed = await placed_backlog(settings, slots, now)
    return next((each for each in placed if each.request.request_id == request_id), None)


def where_it_waits(placed: Placed, now: datetime) -> str:
    """`adapterd get`'s line for a waiting request: one place and one ETA, worked out `now`."""
    w = placed.request
    where = w.where if w.where.startswith("on ") else f"in {w.where}"
    if w.stage == "undecodable":
        return f"{w.request_id}: a record in {w.where} that is not a request: {w.detail}"
    if w.cancel is not None:
        return (
            f"{w.request_id}: cancel pending ({w.cancel.said()}), its `cancelled` event not yet published: it waits "
            f"({w.stage}) {where} until a host reaches it and skips it, placed nowhere and counted in no one's place"
        )
    if w.stage == "accepted":
        return f"{w.request_id}: accepted ({where}): it has a slot on {w.host} and starts now"
    eta = "unknown (nothing to estimate from)" if placed.eta_s is None else f"about {eta_text(placed.eta_s)}"
    return (
        f"{w.request_id}: waiting ({w.stage}) {where}, class {w.priority_class or '-'}, team {w.team}, "
        f"place {placed.place} of {placed.of}{'' if w.priority_class else ' in its partition'}, starts in {eta}; "
        f"worked out at {now:%H:%M:%S}Z from the queues and the events" + (f"; {w.detail}" if w.detail else "")
    )


def queue_table(
    placed: list[Placed], method: str | None, host: str | None, within: timedelta | None, now: datetime
) -> tuple[list[Placed], str | None]:
    """`adapterd jobs --state queued`: the waiting requests in the fleet's order that `jobs`' filters take (host: its
    latest event's), those with a cancel pending left out; and, apart, what to say of those (None: none has)."""
    taken = [
        each
        for each in placed
        if (method is None or each.request.method == method)
        and (host is None or each.request.host == host)
        and (within is None or now - each.request.arrived <= within)
    ]
    pending = [each.request for each in taken if each.request.cancel is not None]
    return [each for each in taken if each.request.cancel is None], pending_said(pending)


def pending_said(pending: list[WaitingRequest]) -> str | None:
    """One line for the waiting requests with a cancel pending: how many, and the first few."""
    if not pending:
        return None
    named = ", ".join(f"{w.request_id} ({w.cancel.said() if w.cancel else ''})" for w in pending[:PENDING_NAMED])
    more = f" and {len(pending) - PENDING_NAMED} more" if len(pending) > PENDING_NAMED else ""
    return (
        f"{len(pending)} waiting request(s) with a cancel pending, not listed and counted in no one's place until "
        f"their `cancelled` events (adapterd get ID): {named}{more}"
    )
