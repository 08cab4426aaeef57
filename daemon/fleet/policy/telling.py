"""When a waiting request is told its place and ETA (its `queued` event): first once, then again whenever they move
materially; one rule, `Telling.due`, for the heads a dispatcher read (daemon/fleet/dispatcher.py) and the requests no
host has read (daemon/fleet/announcer.py).

What each request was last told, and by which host, is folded from the `queued` events of every host
(daemon/fleet/view.py), and noted by this host as it publishes one (its own comes back through the events topic
later), so a host that takes over the announcing goes on from what was said, not from scratch. A request has one
teller at a time: the host that told it last revises it, another only once that telling is `RETELL_HANDOVER_S` old.
A dispatcher sees only the heads it holds and the announcer every unread request, so their places can differ
somewhat; without it the two would take turns correcting each other.

Told again when, at least `RETELL_EVERY_S` after the last telling (by any host):
- its ETA can now be said, where the last telling had none (the fleet's first jobs of a method have no history);
- its expected start (the last telling's time plus its ETA; a right ETA counts down and keeps it) moved by more
  than `RETELL_MIN_S` and more than `RETELL_FRACTION` of the wait it now has: a request told 14 s that will wait 44
  is told again, one told 600 s that moves by 30 is not (5 % of its wait). The fraction is below the benchmark's
  target for the ETA's error (0.25: |told − actual| over the wait from the telling), so a told ETA that drifts
  past it is corrected; the floor keeps a wait of seconds from being retold for every second's jitter;
- or it moved back in the order by more than `RETELL_FRACTION` of its place (1 to 2, not 50 to 52): heavier teams
  or a higher class went ahead, which its place says even where no ETA can be.
Moving forward as the jobs ahead start is what its ETA already said: not news.

A request's first telling is never held back (each request has one). Its revisions are bounded on each host to
`RETELLS_PER_S` on average, in bursts of `RETELL_BURST`, the largest moves first: a higher class arriving ahead of
a backlog of thousands moves them all, and their revisions then go out over minutes, not in one flood of the
events topic.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from daemon.fleet.policy.order import FleetRequest

RETELL_EVERY_S = 5.0
RETELL_MIN_S = 5.0
RETELL_FRACTION = 0.2
RETELLS_PER_S = 5.0
RETELL_BURST = 20.0
RETELL_HANDOVER_S = 30.0

Placed = tuple[FleetRequest, int, float | None]  # a waiting request, its place and its ETA (`FleetView.places`)


@dataclass(frozen=True)
class Told:
    """A request's last `queued` event: its place, its ETA and when it was told (epoch seconds)."""

    place: int
    eta_s: float | None
    at: float
    host: str = ""


def move(told: Told, place: int, eta_s: float | None, now: float) -> float | None:
    """How much telling `place` and `eta_s` now would say that is new, as a fraction of the wait or the place (the
    larger, the more), or None when it is not news (the module's rules)."""
    if told.eta_s is None and eta_s is not None:
        return 1.0  # an ETA at last
    if told.eta_s is not None and eta_s is not None:
        moved = abs(now + eta_s - (told.at + told.eta_s))
        if moved > RETELL_MIN_S and moved > RETELL_FRACTION * eta_s:
            return moved / max(eta_s, 1.0)
    if place > told.place * (1 + RETELL_FRACTION):
        return (place - told.place) / told.place
    return None


class Telling:
    """What each waiting request was last told, and which are to be told now (the module's rules)."""

    def __init__(self) -> None:
        self.told: dict[str, Told] = {}
        # the revisions this host may publish now (a token bucket: `RETELLS_PER_S`, up to `RETELL_BURST`)
        self._tokens = RETELL_BURST
        self._filled: float | None = None  # when they were last counted

    def heard(self, request_id: str, place: int, eta_s: float | None, at: float, host: str) -> None:
        """A `queued` event, this host's or another's: the latest by its time is what the request was last told."""
        last = self.told.get(request_id)
        if last is None or at >= last.at:
            self.told[request_id] = Told(place, eta_s, at, host)

    def started(self, request_id: str) -> None:
        """It has a slot: whatever it was told is over (preempted and waiting again, it is told afresh)."""
        self.told.pop(request_id, None)

    def maybe(self, request_ids: Iterable[str], now: float) -> bool:
        """Whether any of these could be due now (never told, or told long enough ago): the
        places are worked out only then."""
        return any((told := self.told.get(r)) is None or now - told.at >= RETELL_EVERY_S for r in request_ids)

    def due(self, placed: Sequence[Placed], now: float, host: str, *, dry: bool = False) -> list[Placed]:
        """Of these placed requests (`FleetView.places`), those `host` (this one) is to tell now: every one never told,
        then the revisions the rate bound allows, the largest moves first. `dry`: which they would be, the bound's
        budget left as it is."""
        first = [each for each in placed if each[0].request_id not in self.told]
        moves = []
        for each in placed:
            told = self.told.get(each[0].request_id)
            if (
                told is None
                or now - told.at < RETELL_EVERY_S
                or (told.host != host and now - told.at < RETELL_HANDOVER_S)
                or (size := move(told, each[1], each[2], now)) is None
            ):
                continue
            moves.append((size, each))
        tokens = (
            RETELL_BURST
            if self._filled is None
            else min(RETELL_BURST, self._tokens + (now - self._filled) * RETELLS_PER_S)
        )
        moves.sort(key=lambda pair: -pair[0])
        taken = [each for _, each in moves[: int(tokens)]]
        if not dry:
            self._tokens, self._filled = tokens - len(taken), now
        return first + taken
