"""A request of several GPUs is not starved by one-GPU requests: which waiting request a host is reserved for, when
the reservation is due, and whether another job may start meanwhile (backfill, as SLURM's backfill scheduler does).

Without it, each slot a job frees is taken by the next one-GPU request of another partition, and a request of
several GPUs, held at the head of its partition until enough slots are free at once, can wait for ever. With it:

- A request of several GPUs that found too few free slots, and has waited so `reserve_after_s` (the operator's
  bound), holds the host's reservation (the one that has waited longest; one at a time).
- The reservation is due when enough slots are expected free for it (`due`): each slot free when the last job on
  it is expected to end (`RunningJob`'s progress ETA, else its start plus its time limit), a slot with no job now.
- Meanwhile another job starts only where it does not put that moment off (`backfills`): its expected end (its
  start plus its time limit: the request's `timeout_s` capped by `max_timeout_s`) is no later than the due time, or
  the slots it takes are not needed by then. A job with no known end (no time limit), or a reservation whose due
  time is unknown (a running job with none), never backfills.

Pure but for `Reservations`, the scheduler's record of the requests of several GPUs waiting at their partitions'
heads; `now` is the caller's.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Hashable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Head:
    """A request of several GPUs held at the head of its partition for want of free slots, since `since`."""

    key: Hashable  # its partition
    offset: int
    request_id: str
    gpus: int
    since: float


def due(free_at: Mapping[str, float], gpus: int) -> float:
    """When `gpus` slots are expected free at once: the `gpus`-th earliest of the slots' free times (inf: unknown)."""
    times = sorted(free_at.values())
    return times[gpus - 1] if gpus <= len(times) else math.inf


def backfills(free_at: Mapping[str, float], taken: Collection[str], end: float | None, gpus: int) -> bool:
    """Whether a job taking `taken` until `end` (None: unknown) leaves a reservation of `gpus` slots due as soon as
    without it. False when the reservation's due time is unknown: nothing says what it would put off."""
    before = due(free_at, gpus)
    if math.isinf(before):
        return False
    held = math.inf if end is None else end
    after = {slot: max(at, held) if slot in taken else at for slot, at in free_at.items()}
    return due(after, gpus) <= before


class Reservations:
    """The requests of several GPUs waiting at their partitions' heads, and which one the host is reserved for."""

    def __init__(self, after_s: float) -> None:
        self.after_s = after_s  # the operator's bound: how long such a request waits before a host is reserved for it
        self.heads: dict[Hashable, Head] = {}

    def waiting(self, key: Hashable, offset: int, request_id: str, gpus: int, now: float) -> None:
        """A request of `gpus` slots found too few free at `key`'s head: it waits from the first time it did."""
        head = self.heads.get(key)
        if head is None or head.offset != offset:
            self.heads[key] = Head(key, offset, request_id, gpus, now)

    def offered(self, key: Hashable, offset: int) -> None:
        """`key`'s record at `offset` is offered: a head recorded at another offset of it has
        gone (read past, or moved)."""
        head = self.heads.get(key)
        if head is not None and head.offset != offset:
            del self.heads[key]

    def gone(self, key: Hashable) -> None:
        """`key`'s head started, was skipped or let go: it waits no longer."""
        self.heads.pop(key, None)

    def keep(self, keys: Collection[Hashable]) -> None:
        """After a rebalance: only the heads of partitions still held wait here."""
        self.heads = {key: head for key, head in self.heads.items() if key in keys}

    def reserved(self, now: float) -> Head | None:
        """The head the host is reserved for: of those that have waited `after_s`, the one that has waited longest."""
        ready = [head for head in self.heads.values() if now - head.since >= self.after_s]
        return min(ready, key=lambda head: (head.since, head.offset, head.request_id), default=None)
