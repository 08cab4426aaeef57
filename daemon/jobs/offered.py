"""The scheduler's vocabulary: what `Scheduler.offer` did with a request (`Offered`), and a job it
runs on a partition (`RunningJob`), its slots held until its child is done."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from enum import StrEnum

from daemon.job.runner import JobRunner
from daemon.resources.slots import Placement


class Offered(StrEnum):
    """What `Scheduler.offer` did with a request, and so whether intake goes on to the partition's
    next record (`next_record`) or leaves the rest of the batch to be read when the partition resumes."""

    STARTED = "started"  # its job runs; the partition is held past it
    NO_SLOT = "no_slot"  # not enough free slots: the partition is held at it
    WAITING = "waiting"  # a retry not yet due with nothing behind it: the partition is held at it
    DEFERRED = "deferred"  # a retry not yet due: sent behind the requests after it, committed
    SKIPPED = "skipped"  # cancelled before it was reached: `cancelled` published, committed
    ESTIMATING = "estimating"  # its memory estimate is being worked out: the partition is held at it

    @property
    def next_record(self) -> bool:
        return self in (Offered.DEFERRED, Offered.SKIPPED)


@dataclass
class RunningJob:
    """A partition's running job: its request's offset, its runner and task, its slots (None once given back), and
    when it started (epoch seconds: its expected end counts from then, daemon/jobs/reservation.py)."""

    request_id: str
    offset: int
    runner: JobRunner
    placement: Placement | None  # None once given back
    task: asyncio.Task[None]
    started: float = 0.0
