"""The daemon's service loop: consume requests, hand them to intake, and stop gracefully.

The loop is flat: poll the requests topic (paused partitions fetch nothing, but the poll keeps the
member in its group through jobs of many hours), hand each partition's records to `Intake`, wake
retries that are due, measure the consumer lag (daemon/kafka/admin/lag.py). Jobs run beside the loop
(`Scheduler`).

Graceful stop (SIGTERM, SIGINT → `request_stop`): the loop ends at its next turn; rejections in
flight are settled (acknowledged, committed); running jobs save a checkpoint within
`drain_timeout_s` and stop uncommitted, so their requests are read again after a restart and
resume there; a job whose outcome is already published is left to commit. Then the consumer
leaves its group, the warm children are stopped and the producer is flushed.
See docs/architecture.md for the path a request takes.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog
from aiokafka import TopicPartition

from daemon import executors
from daemon.admission.capabilities import available_methods
from daemon.children.processes import ChildSource
from daemon.children.ray_jobs import RayChildSource
from daemon.children.routed import RoutedChildren
from daemon.children.warm import WarmChildren, child_environment
from daemon.fleet.dispatcher import Dispatcher
from daemon.fleet.view import FleetView
from daemon.fleet.wiring import claimed_jobs, kafka_fleet, require_fleet_retry_key
from daemon.hub.whoami import hub_user
from daemon.intake import Intake
from daemon.jobs.scheduler import Scheduler
from daemon.kafka.admin.lag import ConsumerLag
from daemon.kafka.clients import Consumer, FleetKafka, Producer, kafka_consumer
from daemon.kafka.control import ControlReader
from daemon.kafka.partitions import Partitions, RebalanceListener
from daemon.kafka.publisher import Publisher
from daemon.kafka.records import Record
from daemon.kafka.unreadable import CarefulReader
from daemon.ops import metrics
from daemon.ops.heap import freeze_startup_heap
from daemon.ops.http_server import HttpEndpoint, server_tls
from daemon.ops.job_logs import read_job_log
from daemon.ops.systemd import Notifier
from daemon.resources.slots import Slots, slots_of
from daemon.settings import Settings
from daemon.settings.secret_files import token_from
from daemon.store.pruning import prune_store_once
from daemon.store.retention import Pruned, free_bytes, prune_folders_once
from daemon.table.keeper import KafkaTable, Keeper, TableKafka
from schemas.skeleton import prototypes

log = structlog.get_logger()

# The Kafka loop counts as stuck (unhealthy) when it has not turned for this long.
STUCK_AFTER_S = 30.0
KEEPER_STOP_S = 30.0  # how long a stop waits for the table's keeper to write and commit the batch in hand
RETENTION_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class Core:
    """The parts that decide what becomes of each record, wired one way: `Service` runs them over
    Kafka and the children, and the unit tests (tests/core.py) run the same wiring on fakes. With
    priority classes the fleet's `dispatcher` takes requests from the classes' queues into this host's
    claims partitions, which `partitions` are then (daemon/fleet/dispatcher.py); without, it is None. Every daemon
    keeps the table of requests beside them (`keeper`, daemon/table/keeper.py), as one of the keepers' group."""

    publisher: Publisher
    partitions: Partitions
    slots: Slots
    scheduler: Scheduler
    intake: Intake
    dispatcher: Dispatcher | None
    keeper: Keeper


def wire(
    settings: Settings,
    consumer: Consumer,
    producer: Producer | None,
    slots: Slots,
    children: ChildSource,
    on_change: Callable[[], None],
    fleet: FleetKafka | None = None,
    clock: Callable[[], float] = time.time,
    table: TableKafka | None = None,
) -> Core:
    """The core over these clients; with priority classes the fleet's over `fleet` (aiokafka's when None, as the
    publisher's producer), the table's keeper over `table` (the same). `clock` is the scheduler's (the tests' way to
    move it)."""
    partitions = Partitions(consumer)
    # The fleet as the events say it, with this host's own ends as it sends them (a host with priority classes).
    view = FleetView(settings) if settings.class_topics else None
    keeper = Keeper(
        settings,
        table if table is not None else KafkaTable(settings),
        view_whole=None if view is None else view.caught_up,  # the view restored first
    )
    if view is None:
        publisher = Publisher(settings, producer)
        scheduler = Scheduler(settings, publisher, partitions, slots, children, on_change=on_change, clock=clock)
        intake = Intake(settings, publisher, partitions, scheduler, slots)
        return Core(publisher, partitions, slots, scheduler, intake, None, keeper)
    publisher = Publisher(settings, producer, watchers=[view.sending])
    kafka = fleet if fleet is not None else kafka_fleet(settings)
    claimed = claimed_jobs(settings, kafka, slots, partitions)
    scheduler = Scheduler(
        settings, publisher, partitions, slots, children, on_change=on_change, fleet=claimed, clock=clock
    )
    intake = Intake(settings, publisher, partitions, scheduler, slots)
    dispatcher = Dispatcher(settings, scheduler, claimed, intake, kafka, view)
    return Core(publisher, partitions, slots, scheduler, intake, dispatcher, keeper)


class Service:
    """The daemon. Its Kafka clients are aiokafka's unless a test passes its own (daemon/kafka/clients.py; the
    table's keeper's, daemon/table/keeper.py `TableKafka`)."""

    def __init__(
        self,
        settings: Settings,
        *,
        consumer: Consumer | None = None,
        producer: Producer | None = None,
        table: TableKafka | None = None,
    ) -> None:
        require_fleet_retry_key(settings)  # before anything is made: a ConfigError, exit 2
        self.settings = settings
        self.consumer = consumer if consumer is not None else kafka_consumer(settings)
        self.warm = WarmChildren(
            child_environment(settings),
            settings.work_dir / "children.log",
            settings.jobs_dir,
            enabled=settings.warm_child,
            mode=settings.child_start,
        )
        # A job bigger than this host runs on the operator's Ray cluster, when there is one (daemon/settings/ray.py).
        self.children: ChildSource = (
            self.warm
            if settings.ray is None
            else RoutedChildren(
                self.warm,
                RayChildSource(
                    settings.ray, child_environment(settings), settings.ray.stop_grace_s or settings.drain_timeout_s
                ),
            )
        )
        core = wire(
            settings,
            self.consumer,
            producer,
            slots_of(settings),
            self.children,
            on_change=self._report_status,
            table=table,
        )
        self.publisher, self.partitions, self.slots, self.scheduler, self.intake, self.dispatcher = (
            core.publisher,
            core.partitions,
            core.slots,
            core.scheduler,
            core.intake,
            core.dispatcher,
        )
        self.keeper = core.keeper
        self.reader = CarefulReader(self.consumer, self.partitions)
        # With priority classes, requests wait in the classes' queues and this host takes them into
        # its claims partitions while it has room (daemon/fleet/dispatcher.py); the loop runs the claims.
        self.topic = settings.claims_topic if self.dispatcher is not None else settings.requests_topic
        self.control = ControlReader(settings, self.scheduler.control)
        self.notifier = Notifier()
        self.http: HttpEndpoint | None = None
        self.stop_requested = asyncio.Event()
        self.ready = asyncio.Event()
        self.last_turn = time.monotonic()
        self.lag = ConsumerLag(self.consumer)  # daemon/kafka/admin/lag.py

    def request_stop(self) -> None:
        running = len(self.scheduler.jobs)
        log.info("daemon.stopping", running_jobs=running)
        self.notifier.stopping(f"stopping; {running} job(s) saving a checkpoint")
        if running:
            self.notifier.extend_stop(self.settings.drain_timeout_s + 30)
        self.stop_requested.set()

    async def run(self) -> None:
        metrics.SLOTS.set(self.slots.total)
        # Read at each scrape: the free space now, not as of the last pass of retention.
        metrics.WORK_DIR_FREE.set_function(lambda: free_bytes(self.settings.work_dir))
        if self.settings.metrics_address:
            logs_token = self.settings.logs_token.get_secret_value() if self.settings.logs_token is not None else None
            tls = (
                server_tls(self.settings.http_tls_certfile, self.settings.http_tls_keyfile)
                if self.settings.http_tls_certfile and self.settings.http_tls_keyfile
                else None
            )
            self.http = HttpEndpoint(
                self.settings.metrics_address, self.health, self.status, self.job_log, logs_token, tls=tls
            ).start()
        await self.publisher.start()
        # UTS #39's confusables (credential-named keys by their skeleton), read once off the loop before
        # any request: the first key beyond ASCII does not wait for them on it.
        await executors.run("decode", prototypes)
        await self.scheduler.prepare_children()
        # Full collections walk only what is made from here on. Before the table's keeper and the fleet's view load
        # what they hold: a collection then walked their loading too (0.5 s with 22,605 requests on
        # benchmarks.fleet_scale) and set its passing objects apart for ever.
        frozen = freeze_startup_heap()
        switch_interval_s = executors.favour_the_loop()  # before the worker threads parse beside the loop
        self._pruning = asyncio.create_task(self._prune_job_folders(), name="retention")
        keeping = asyncio.create_task(self.keeper.run(), name="table-keeper")
        try:
            token = token_from(self.settings)  # whose token, asked before the consumer starts: not while it joins
            sink = (
                {"sink": "local", "outputs": str(self.settings.work_dir / "outputs")}
                if token is None
                else {
                    "sink": "hub",
                    "hub": self.settings.hub_endpoint,
                    "token_from": token,
                    "hub_user": await hub_user(self.settings),
                }
            )
            await self.control.start()  # cancels first: a request cancelled while no daemon ran is skipped
            self.consumer.subscribe(
                [self.topic],
                listener=RebalanceListener(
                    self._on_assigned, self.dispatcher.mover.settled if self.dispatcher is not None else None
                ),
            )
            await self.consumer.start()
            dispatching = await self._start_dispatcher()
            log.info(
                "daemon.started",
                topic=self.topic,
                group_id=self.settings.group_id,
                queues=self.settings.class_topics or None,
                gpus=self.slots.gpus,
                slots=self.slots.total,
                methods=available_methods(),
                **sink,
                events_signed_by=self.publisher.signer.key_id
                if self.publisher.signer is not None
                else None,  # None: unsigned
                heap_frozen=frozen,
                switch_interval_s=switch_interval_s,
                teams=self.intake.grants.describe(),
            )
            try:
                await self._poll_until_stopped()
            finally:
                if self.dispatcher is not None:  # no more claims: this host leaves the queues' groups first
                    await asyncio.gather(dispatching, return_exceptions=True)
                    await self.dispatcher.stop()
                await self.partitions.settled()
                await self.scheduler.stop_jobs()
                await self.consumer.stop()
        finally:
            self._pruning.cancel()
            await self._stop_keeper(keeping)
            await self.control.stop()
            await self.children.close()
            await self.publisher.stop()
            if self.http is not None:
                self.http.stop()
            log.info("daemon.stopped")

    async def _stop_keeper(self, keeping: asyncio.Task[None]) -> None:
        """The table's keeper stopped: what it folded is written and committed, then it leaves its group (cut short
        after KEEPER_STOP_S: what it had not committed is folded again by the next keeper, harmlessly)."""
        self.keeper.stop()
        try:
            await asyncio.wait_for(keeping, KEEPER_STOP_S)
        except TimeoutError:
            log.warning("table.keeper_stop_timeout", after_s=KEEPER_STOP_S)

    async def _start_dispatcher(self) -> asyncio.Future[None]:
        """The fleet's dispatcher, running beside the loop until the stop (a finished future without classes)."""
        if self.dispatcher is None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        await self.dispatcher.start()
        return asyncio.create_task(self.dispatcher.run(self.stop_requested), name="fleet-dispatcher")

    async def _poll_until_stopped(self) -> None:
        while not self.stop_requested.is_set():
            batches, unreadable = await self.reader.poll(timeout_ms=500, max_records=2000)
            self.last_turn = time.monotonic()
            self.notifier.feed_watchdog()
            for record, exc in unreadable:
                await self.intake.reject_unreadable(record, exc)
            for tp, records in batches.items():
                await self._take(tp, records)
            self.scheduler.wake(await self.lag.measure(self.last_turn, self._running_offset))

    async def _take(self, tp: TopicPartition, records: Sequence[Record]) -> None:
        """Intake of one partition's batch, whose exceptions never leave the loop. Intake rejects a
        record whose decision raised (`internal`); what raises past it is no record's doing (a send
        the producer refused, a bug in the loop's bookkeeping): logged, counted, and the partition
        is read again from the batch's first record unless a job holds it, as after a restart."""
        try:
            await self.intake.take(tp, records)
        except Exception as exc:
            log.exception(
                "intake.batch_failed",
                partition=tp.partition,
                first_offset=records[0].offset if records else None,
                error=type(exc).__name__,
            )
            metrics.INTAKE_ERRORS.labels(type(exc).__name__).inc()
            if records and not self.scheduler.holds(tp):
                self.partitions.read_from(tp, records[0].offset)

    def _running_offset(self, tp: TopicPartition) -> int | None:
        """The offset of the request `tp`'s running job runs: it counts in the lag until the job commits it."""
        job = self.scheduler.jobs.get(tp)
        return job.offset if job is not None else None

    async def _on_assigned(self, assigned: set[TopicPartition]) -> None:
        self.partitions.on_assigned(assigned)
        await self.scheduler.on_assigned(assigned)
        if not self.ready.is_set():
            self.ready.set()
            self.notifier.ready(f"joined group {self.settings.group_id}; {self.slots.total} slot(s)")

    def health(self) -> tuple[bool, dict[str, Any]]:
        """Healthy once the consumer has joined its group, while the Kafka loop keeps turning."""
        since_turn = time.monotonic() - self.last_turn
        healthy = self.ready.is_set() and since_turn < STUCK_AFTER_S and not self.stop_requested.is_set()
        return healthy, {
            "healthy": healthy,
            "joined_group": self.ready.is_set(),
            "stopping": self.stop_requested.is_set(),
            "seconds_since_poll": round(since_turn, 3),
        }

    async def _prune_job_folders(self) -> None:
        """Retention: a pass at start, then every RETENTION_INTERVAL_S."""
        while True:
            await self.prune_once()
            await prune_store_once(self.settings, self._running(), time.time())
            await asyncio.sleep(RETENTION_INTERVAL_S)

    async def prune_once(self) -> Pruned | None:
        """One pass of retention over the job folders (daemon/store/retention.py), this
        daemon's running jobs left alone."""
        return await prune_folders_once(self.settings, self._running, time.time())

    def _running(self) -> set[str]:
        return {job.request_id for job in self.scheduler.jobs.values()}

    def job_log(self, request_id: str, offset: int, limit: int) -> tuple[bytes, int] | None:
        """A job's log (its child's output) from `offset`, read in the endpoint's thread (daemon/ops/job_logs.py); a
        job run on Ray has its folder on the folder the cluster shares (its Ray job's log, as this host read it)."""
        found = read_job_log(self.settings.jobs_dir, request_id, offset, limit)
        if found is None and self.settings.ray is not None:
            found = read_job_log(self.settings.ray.shared_dir, request_id, offset, limit)
        return found

    def status(self) -> dict[str, Any]:
        """What this host is running: for `adapterd status` and operators."""
        return {
            "host": self.settings.host,
            "group_id": self.settings.group_id,
            "gpus": self.slots.gpus,
            "gpu_kind": self.slots.kind.kind,  # as requests' resources.gpu_kind name it; None without GPUs or unknown
            "gpu_memory_gib": self.slots.kind.memory_gib,
            "slots": {"total": self.slots.total, "busy": self.slots.busy, "free": self.slots.free},
            # With packing: each GPU's jobs and the memory their shares hold (each job's own share is in `jobs`).
            "packing": None
            if self.slots.packing is None
            else {
                "max_jobs_per_gpu": self.slots.packing.max_jobs,
                "usable_bytes": self.slots.packing.usable,
                "gpus": {
                    gpu: {"jobs": jobs, "reserved_bytes": reserved}
                    for gpu, (jobs, reserved) in self.slots.by_gpu().items()
                },
            },
            "jobs": self.scheduler.status(),
            "children": self.warm.describe(),
        }

    def _report_status(self) -> None:
        if self.dispatcher is not None:
            self.dispatcher.wake.set()  # a slot may have freed: the dispatcher looks at the queues now
        if self.ready.is_set():
            jobs, free = len(self.scheduler.jobs), len(self.slots.free)
            self.notifier.status(f"{jobs} job(s) running; {free} of {self.slots.total} slot(s) free")
