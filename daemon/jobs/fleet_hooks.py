"""What the fleet's queue adds to the scheduler's jobs, with priority classes only: the seam the
scheduler calls (`Scheduler.fleet`), which daemon/fleet/jobs.py's `FleetJobs` fills; without classes
there is none, and the scheduler runs a partition's requests as its own queue.
"""

from __future__ import annotations

from typing import Protocol

from aiokafka import TopicPartition

from daemon.job.runner import JobRunner
from daemon.kafka.publisher import Outgoing
from daemon.kafka.records import Record
from schemas import RequestBase


class FleetHooks(Protocol):
    """What the fleet's queue adds to a job (daemon/fleet/jobs.py), with priority classes only."""

    def accepted_fields(self, tp: TopicPartition, record: Record, request: RequestBase) -> dict[str, str | int]:
        """The `accepted` event's class and team; the job is counted as started."""

    async def after_interrupt(self, tp: TopicPartition, record: Record, runner: JobRunner) -> bool:
        """After a job ended interrupted: True when it was preempted and its claim is committed."""

    def forget(self, tp: TopicPartition) -> None: ...

    def requeued(self, record: Record, request: RequestBase, retry: Outgoing) -> Outgoing:
        """A claimed request's retry, sent to the queue of the class it runs as (where it
        waits), signed by the fleet."""
