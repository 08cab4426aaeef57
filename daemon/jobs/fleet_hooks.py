"""What the fleet's queue adds to the scheduler's jobs: the seam the scheduler calls (`Scheduler.fleet`,
given at its construction), which daemon/fleet/claimed.py's `ClaimedJobs` fills with priority classes;
without classes it is `NO_FLEET`, which adds nothing, and the scheduler runs a partition's requests as its
own queue.
"""

from __future__ import annotations

from typing import Protocol

from aiokafka import TopicPartition

from daemon.job.runner import JobRunner
from daemon.kafka.publisher import Outgoing
from daemon.kafka.records import Record
from schemas import RequestBase


class FleetHooks(Protocol):
    """What the fleet's queue adds to a job: daemon/fleet/claimed.py's with priority classes, `NO_FLEET` without."""

    # Whether the fleet drains a host for a request of several GPUs (daemon/fleet/policy/drain.py); without, the
    # scheduler reserves the host for one waiting at a partition's head (daemon/jobs/reservation.py).
    @property
    def drains(self) -> bool: ...

    def accepted_fields(self, tp: TopicPartition, record: Record, request: RequestBase) -> dict[str, str | int]:
        """The `accepted` event's class and team; the job is counted as started."""

    async def after_interrupt(self, tp: TopicPartition, record: Record, runner: JobRunner) -> bool:
        """After a job ended interrupted: True when it was preempted and its claim is committed."""

    async def back_to_queue(self, tp: TopicPartition, record: Record, request: RequestBase) -> bool:
        """A claim held or paused (daemon/jobs/holds.py): back to its class's queue, its claim committed; False when
        its claims partition moved meanwhile."""

    def forget(self, tp: TopicPartition) -> None: ...

    def requeued(self, record: Record, request: RequestBase, retry: Outgoing) -> Outgoing:
        """A claimed request's retry, sent to the queue of the class it runs as (where it waits), signed by the
        fleet."""


class NoFleet:
    """The fleet hooks of a daemon without priority classes: a request runs where it was read, as it is."""

    drains = False

    def accepted_fields(self, tp: TopicPartition, record: Record, request: RequestBase) -> dict[str, str | int]:
        return {}

    async def after_interrupt(self, tp: TopicPartition, record: Record, runner: JobRunner) -> bool:
        return False  # never preempted: read again, as after a daemon stop

    async def back_to_queue(self, tp: TopicPartition, record: Record, request: RequestBase) -> bool:
        return False  # no queue but the partition it was read from: daemon/jobs/holds.py sends it to its end

    def forget(self, tp: TopicPartition) -> None:
        pass

    def requeued(self, record: Record, request: RequestBase, retry: Outgoing) -> Outgoing:
        return retry  # back to the topic it was read from


NO_FLEET = NoFleet()
