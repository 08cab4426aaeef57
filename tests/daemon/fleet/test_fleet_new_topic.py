"""A class's queue topic made after the daemons started is read within seconds (issue 57): a host subscribed to a
topic that did not exist learns of it at its consumer's next metadata refresh, which for the queues' consumers is
QUEUE_METADATA_MAX_AGE_MS (daemon/kafka/clients.py), not aiokafka's five-minute default. On a broker of the
test's own that creates no topic by itself, as a production cluster should not."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from daemon.kafka.admin.topics import ARRIVAL_STAMPED, wanted
from daemon.kafka.event_reader import EventStream
from daemon.kafka.options import kafka_options
from daemon.local_broker import LocalKafka, free_port
from daemon.settings import Settings
from schemas import Accepted, Cancel
from testbed.client import produce
from testbed.data import HUB_TOKEN
from testbed.fleet_keys import fleet_keys
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

pytestmark = pytest.mark.slow

CLASSES = [{"name": "urgent"}, {"name": "default"}]
NOTICED_WITHIN_S = 30.0  # aiokafka's default metadata_max_age_ms would take up to 300 s


@pytest.fixture
def strict_broker(tmp_path: Path) -> Iterator[LocalKafka]:
    broker = LocalKafka(data_dir=tmp_path / "kafka", properties={"auto.create.topics.enable": "false"}).start()
    yield broker
    broker.stop()


async def create(settings: Settings, topics: dict[str, int], stamped: set[str]) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(name, count, 1, topic_configs=ARRIVAL_STAMPED if name in stamped else None)
                for name, count in topics.items()
            ]
        )
    finally:
        await admin.close()


async def test_a_class_topic_created_after_the_daemon_started_is_read_within_seconds(
    strict_broker: LocalKafka,
    published: HubServer,
    tmp_path: Path,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    settings = Settings(
        bootstrap_servers=strict_broker.bootstrap_servers,
        requests_topic=f"requests-{suffix}",
        events_topic=f"events-{suffix}",
        dlq_topic=f"dlq-{suffix}",
        control_topic=f"control-{suffix}",
        claims_topic=f"claims-{suffix}",
        group_id=f"adapterd-{suffix}",
        work_dir=tmp_path / "work",
        hub_endpoint=published.endpoint,
        hub_token=HUB_TOKEN,
        progress_interval_s=0,  # type: ignore[arg-type]
        allowed_local_model_roots=[tmp_path],
        log_format="json",
        metrics_address=f"127.0.0.1:{free_port()}",
        priority_classes=Settings(priority_classes=CLASSES, **fleet_keys(tmp_path / "keys")).priority_classes,
        default_priority_class="default",
        job_slots=2,
        warm_child=False,
        session_timeout_ms=10_000,
        **fleet_keys(tmp_path / "keys"),
    )
    urgent = settings.class_topics["urgent"]
    topics = wanted(settings, 2)
    await create(
        settings, {name: count for name, count in topics.items() if name != urgent}, set(settings.class_topics.values())
    )
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        async with EventStream(settings) as stream:
            # Its queues are read (the default class's topic exists): the host is past its
            # start, subscribed to urgent's too.
            await produce(
                settings,
                json.dumps(sft_request("first", priority_class="default")).encode(),
                b"first",
                topic=settings.requests_topic,
            )
            async for event in stream.events("first", until_terminal=False):
                if isinstance(event, Accepted):
                    break
            await create(settings, {urgent: 2}, {urgent})
            await produce(
                settings,
                json.dumps(sft_request("late-class", priority_class="urgent")).encode(),
                b"late-class",
                topic=urgent,
            )
            async with asyncio.timeout(NOTICED_WITHIN_S):
                async for event in stream.events("late-class", until_terminal=False):
                    if isinstance(event, Accepted):
                        break
        assert event.request_id == "late-class" and event.priority_class == "urgent"
        for request_id in ("first", "late-class"):
            await produce(
                settings,
                Cancel(request_id=request_id, reason="seen").model_dump_json().encode(),
                request_id.encode(),
                topic=settings.control_topic,
            )
    finally:
        daemon.stop()
