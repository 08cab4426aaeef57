"""The fleet's parts, wired for one daemon: its transactional mover, shared by the dispatcher (claims)
and the scheduler's preemptions (requeues); and what a daemon with priority classes needs to start."""

from __future__ import annotations

from daemon.errors import ConfigError
from daemon.fleet.dispatcher import Dispatcher
from daemon.fleet.jobs import FleetJobs
from daemon.fleet.moves import Mover
from daemon.intake import Intake
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.partitions import Partitions
from daemon.settings import Settings


def require_fleet_retry_key(settings: Settings) -> None:
    """A daemon with priority classes needs `retry_key_file`: a request moves between hosts (claims, preemptions)
    with its retry and preemption counts signed by the host that set them, and with a key per host (the default,
    work_dir/retry-key) another host reads them as unsigned: a first try, never preempted. Required where the
    daemon starts, not in the settings: a CLI with the fleet's settings must not need the fleet's secret.
    A ConfigError (`adapterd run` exits 2) naming the setting."""
    if settings.priority_classes and settings.retry_key_file is None:
        raise ConfigError(
            "invalid settings: priority_classes need retry_key_file, one key for the fleet (16 bytes or more; "
            "deploy/README.md): another host reads a retry's attempt and a preemption count signed with this "
            "host's own key as unsigned"
        )


def fleet_dispatcher(settings: Settings, scheduler: Scheduler, claims: Partitions, intake: Intake) -> Dispatcher:
    mover = Mover(settings)
    jobs = FleetJobs(settings, mover, scheduler.retries, scheduler)
    scheduler.fleet = jobs
    return Dispatcher(settings, scheduler, jobs, claims, mover, intake)
