"""Each waiting request's place in the fleet's order and its ETA, as `adapterd jobs --state queued`
and `adapterd get` show them: one function, `place_and_eta`.

The order: classes first (Settings.priority_classes, highest first), then arrival. The ETA: the fleet's
slots (`--slots`) become free as the running jobs end (each job's own latest `eta_s`, less the time
since it said it; else the typical duration of its method, less the time it has run), and the waiting
requests take them in order, each holding its slot for the typical duration of its method and model
(the median of the recent `succeeded` events of the same method and model, else of the method, else
of every job). Where nothing is known to estimate from, the ETA is unknown rather than guessed: from
the first request that would need such a slot on, every later one's is unknown too.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import defaultdict, deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from daemon.cli.jobs import fold
from daemon.cli.waiting import Backlog, Waiting, read_backlog
from daemon.settings import Settings
from schemas import Event

RECENT = 20  # the durations of a method and model kept: the latest ones say most of what the next will take
RECENT_HOSTS = timedelta(hours=24)  # a host that started a job in this past counts as one slot for the default --slots


@dataclass(frozen=True)
class Placed:
    """A waiting request, its place (1: next to start; None for a record that is not a request) and its ETA in seconds."""

    request: Waiting
    place: int | None
    eta_s: float | None

    def line(self) -> str:
        w = self.request
        return (f"{w.request_id:<28} {w.priority_class or '-':<10} {w.team:<12} {self.place or '-':>5} {eta_text(self.eta_s):>7}  "
                f"{w.stage:<11} {w.method or '-':<12} {w.where}" + (f"  {w.detail}" if w.detail else ""))


HEADER = f"{'REQUEST':<28} {'CLASS':<10} {'TEAM':<12} {'PLACE':>5} {'ETA':>7}  {'WAITING':<11} {'METHOD':<12} WHERE"


class Durations:
    """How long a job holds its slot, from the `succeeded` events: seconds from start to end (total less queue)."""

    def __init__(self, events: list[Event]) -> None:
        self.by_key: dict[tuple[str, str | None], deque[float]] = defaultdict(lambda: deque(maxlen=RECENT))
        for event in events:
            spent = getattr(event, "durations_s", None)
            if event.type != "succeeded" or not spent or "total" not in spent:
                continue  # a duplicate found by its Hub commit trained nothing
            held = max(0.0, spent["total"] - spent.get("queue", 0.0))
            for key in ((event.method, event.base_model), (event.method, None), ("", None)):
                self.by_key[key].append(held)

    def typical(self, method: str | None, model: str | None) -> float | None:
        for key in ((method or "", model), (method or "", None), ("", None)):
            if self.by_key.get(key):
                return statistics.median(self.by_key[key])
        return None


def place_and_eta(waiting: list[Waiting], events: list[Event], settings: Settings, slots: int, now: datetime) -> list[Placed]:
    """The waiting requests in the fleet's order, each with its place and ETA; records that are not requests last, unplaced."""
    rank = {c.name: index for index, c in enumerate(settings.priority_classes)}
    lowest = len(rank)
    ordered = sorted((w for w in waiting if w.stage != "undecodable"),
                     key=lambda w: (rank.get(w.priority_class or "", lowest), w.arrived, w.request_id))
    durations = Durations(events)
    left = running_left(events, durations, now)
    free = sorted(math.inf if t is None else t for t in left) + [0.0] * max(0, slots - len(left))
    heapq.heapify(free)
    placed = []
    for place, w in enumerate(ordered, start=1):
        starts = heapq.heappop(free)
        held = durations.typical(w.method, w.model)
        heapq.heappush(free, math.inf if held is None or math.isinf(starts) else starts + held)
        placed.append(Placed(w, place, None if math.isinf(starts) else starts))
    return placed + [Placed(w, None, None) for w in waiting if w.stage == "undecodable"]


def running_left(events: list[Event], durations: Durations, now: datetime) -> list[float | None]:
    """Seconds until each running job ends: its own latest ETA, else its method's typical duration less what it ran; None: unknown."""
    latest_eta: dict[str, tuple[datetime, float]] = {}
    started: dict[str, datetime] = {}
    for event in events:
        if event.request_id is None:
            continue
        if event.type == "progress" and event.eta_s is not None:
            latest_eta[event.request_id] = (event.time, event.eta_s)
        elif event.type == "started":
            started[event.request_id] = event.time
            latest_eta.pop(event.request_id, None)  # an earlier attempt's ETA says nothing of this one
    left: list[float | None] = []
    for request_id, job in fold(events).items():
        if job.state != "running":
            continue
        if request_id in latest_eta:
            said, eta = latest_eta[request_id]
            left.append(max(0.0, eta - (now - said).total_seconds()))
            continue
        typical = durations.typical(job.method, None)
        ran = (now - started.get(request_id, job.last)).total_seconds()
        left.append(None if typical is None else max(0.0, typical - ran))
    return left


def default_slots(events: list[Event], now: datetime) -> int:
    """The fleet's slots when --slots is not given: the hosts that started a job in the last 24 hours, one slot each (at least 1)."""
    return max(1, len({event.host for event in events if event.type == "started" and now - event.time <= RECENT_HOSTS}))


def eta_text(eta_s: float | None) -> str:
    if eta_s is None:
        return "-"
    if eta_s < 90:
        return f"{eta_s:.0f}s"
    if eta_s < 5400:
        return f"{eta_s / 60:.0f}m"
    return f"{eta_s / 3600:.1f}h"


async def placed_backlog(settings: Settings, slots: int | None, now: datetime, events: list[Event] | None = None) -> tuple[Backlog, list[Placed]]:
    """Every waiting request (daemon/cli/waiting.py), placed in the fleet's order with its ETA."""
    backlog = await read_backlog(settings, events)
    return backlog, place_and_eta(backlog.waiting, backlog.events, settings, slots or default_slots(backlog.events, now), now)


def where_it_waits(placed: Placed, total: int) -> str:
    """`adapterd get`'s line for a waiting request."""
    w = placed.request
    if placed.place is None:
        return f"{w.request_id}: a record in {w.where} that is not a request: {w.detail}"
    eta = "unknown (nothing to estimate from)" if placed.eta_s is None else f"about {eta_text(placed.eta_s)}"
    where = w.where if w.where.startswith("on ") else f"in {w.where}"
    return (f"{w.request_id}: waiting ({w.stage}) {where}, class {w.priority_class or '-'}, team {w.team}, "
            f"place {placed.place} of {total}, starts in {eta}" + (f"; {w.detail}" if w.detail else ""))


def queue_table(placed: list[Placed], method: str | None, host: str | None, within: timedelta | None, now: datetime) -> list[str]:
    """`adapterd jobs --state queued`: the waiting requests in the fleet's order, with `jobs`' filters (host: its latest event's)."""
    return [HEADER] + [each.line() for each in placed
                       if (method is None or each.request.method == method) and (host is None or each.request.host == host)
                       and (within is None or now - each.request.arrived <= within)]
