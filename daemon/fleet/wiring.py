"""The fleet's parts, wired for one daemon: its transactional mover, shared by the dispatcher (claims)
and the scheduler's preemptions (requeues)."""

from __future__ import annotations

from daemon.fleet.dispatcher import Dispatcher
from daemon.fleet.jobs import FleetJobs, claimed_class
from daemon.fleet.moves import Mover
from daemon.intake import Intake
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.partitions import Partitions
from daemon.settings import Settings


def fleet_dispatcher(settings: Settings, scheduler: Scheduler, claims: Partitions, intake: Intake) -> Dispatcher:
    mover = Mover(settings)
    jobs = FleetJobs(settings, mover, scheduler.retries, scheduler)
    scheduler.fleet = jobs
    intake.runs_as = lambda record, request: claimed_class(record, request, settings)  # what it is granted: the class it runs as
    return Dispatcher(settings, scheduler, jobs, claims, mover, intake)
