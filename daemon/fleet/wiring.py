"""The fleet's parts, wired for one daemon (daemon/service.py `wire` calls these): the scheduler's fleet hooks
(`ClaimedJobs`, with the transactional mover it shares with the dispatcher: claims, and preemptions' requeues),
given to the scheduler at its construction, and the dispatcher's over them (daemon/fleet/dispatcher.py); the fleet's
Kafka (`FleetKafka`: aiokafka's here, in-memory ones in the tests); and what a daemon with priority classes needs to
start."""

from __future__ import annotations

from functools import partial

from daemon.errors import ConfigError
from daemon.fleet.claimed import ClaimedJobs
from daemon.fleet.moves import Mover
from daemon.kafka.admin.group_offsets import KafkaQueueReads
from daemon.kafka.clients import FleetKafka, KafkaTransactions, queue_consumer
from daemon.kafka.partitions import Partitions
from daemon.kafka.retry_state import RetrySigner
from daemon.resources.slots import Slots
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


def kafka_fleet(settings: Settings) -> FleetKafka:
    """The fleet's Kafka over aiokafka: the host's transactional producer, a consumer per class's queue group, and
    the admin client and readers of the queues from outside their groups."""
    return FleetKafka(KafkaTransactions(settings), partial(queue_consumer, settings), KafkaQueueReads(settings))


def claimed_jobs(settings: Settings, kafka: FleetKafka, slots: Slots, claims: Partitions) -> ClaimedJobs:
    """The scheduler's fleet hooks, over the host's claims partitions (`claims`, which the scheduler runs)."""
    retries = RetrySigner.from_settings(settings.retry_key_file, settings.work_dir, settings.max_attempts)
    return ClaimedJobs(settings, Mover(settings, kafka.transactions), retries, slots, claims)
