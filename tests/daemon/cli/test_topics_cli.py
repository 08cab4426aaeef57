"""`adapterd topics` against a real broker: every topic the settings name is created once with the partitions
asked, each per-topic result is read (a refused one is named with the broker's reason, exit 1), a topic with
fewer partitions than asked is said and grown only with --grow; `adapterd doctor` says too few partitions."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.kafka.admin.topics import topic_config
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from testbed.fleet_keys import fleet_keys
from testbed.processes import settings_environment

runner = CliRunner()
CLASSES = [{"name": "urgent"}, {"name": "default"}, {"name": "batch", "preemptible": True}]


def fleet_settings(settings: Settings, tmp_path: Path, **more: Any) -> Settings:
    suffix = uuid.uuid4().hex[:8]
    return settings.model_copy(
        update={
            **fleet_keys(tmp_path / "keys"),
            "priority_classes": Settings(priority_classes=CLASSES, **fleet_keys(tmp_path / "keys")).priority_classes,
            "default_priority_class": "default",
            "requests_topic": f"fresh-requests-{suffix}",
            "events_topic": f"fresh-events-{suffix}",
            "dlq_topic": f"fresh-dlq-{suffix}",
            "control_topic": f"fresh-control-{suffix}",
            "claims_topic": f"fresh-claims-{suffix}",
            "state_topic": f"fresh-state-{suffix}",
            **more,
        }
    )


def topics(settings: Settings, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["topics", *args], env=settings_environment(settings))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


async def grown(settings: Settings, count: int) -> dict[str, int]:
    """The topics' partitions once each has at least `count`: the controller grew them; each broker's
    metadata says so a moment later."""
    async with asyncio.timeout(10):
        while True:
            found = await partitions(settings)
            if all(have >= count for have in found.values()):
                return found
            await asyncio.sleep(0.05)


async def partitions(settings: Settings) -> dict[str, int]:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        names = [
            settings.requests_topic,
            settings.events_topic,
            settings.dlq_topic,
            settings.control_topic,
            *settings.class_topics.values(),
            settings.claims_topic,
            settings.state_topic,
        ]
        # Only listed topics are described: a metadata request naming a missing topic may make it (auto-creation).
        async with asyncio.timeout(10):
            while settings.requests_topic not in (existing := set(await admin.list_topics())):
                await asyncio.sleep(0.05)  # the controller made it; this broker's metadata lists it a moment later
        described = await admin.describe_topics([name for name in dict.fromkeys(names) if name in existing])
    finally:
        await admin.close()
    return {entry["topic"]: len(entry["partitions"]) for entry in described if entry.get("partitions")}


def test_every_topic_of_a_fleet_with_classes_is_created_once_with_the_partitions_asked(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = fleet_settings(settings, tmp_path)
    code, output = topics(fleet, "--partitions", "3")
    assert code == 0, output
    found = asyncio.run(partitions(fleet))
    requests = fleet.requests_topic
    assert found[requests] == 3, found  # the default class's queue: the requests topic itself
    assert found[f"{requests}.urgent"] == found[f"{requests}.batch"] == 3, found
    assert found[fleet.events_topic] == found[fleet.dlq_topic] == found[fleet.control_topic] == 3, found
    assert found[fleet.claims_topic] >= 3, found
    assert found[fleet.state_topic] == 3, found  # the table of requests: the events topic's partitions, compacted
    assert asyncio.run(topic_config(fleet, fleet.state_topic))["cleanup.policy"] == "compact"
    assert "topics ready" in output


def test_a_topic_the_broker_refuses_is_named_with_its_reason_and_exit_1(settings: Settings, tmp_path: Path) -> None:
    # A name Kafka refuses (over 249 characters): the broker's per-topic error, not an exception of the call.
    fleet = fleet_settings(settings, tmp_path, dlq_topic="d" * 250)
    code, output = topics(fleet, "--partitions", "2")
    assert code == 1, output
    assert "d" * 250 in output and "topics ready" not in output, output
    found = asyncio.run(partitions(fleet))
    assert found[fleet.requests_topic] == 2, found  # the others were still made


async def existing_one_partition(fleet: Settings) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(fleet))
    await admin.start()
    try:
        names = list(
            dict.fromkeys(
                [
                    fleet.requests_topic,
                    fleet.events_topic,
                    fleet.dlq_topic,
                    fleet.control_topic,
                    *fleet.class_topics.values(),
                ]
            )
        )
        await admin.create_topics([NewTopic(name, 1, 1) for name in names])
        while not set(names) <= set(await admin.list_topics()):  # the controller answers before every broker lists them
            await asyncio.sleep(0.05)
    finally:
        await admin.close()


def test_topics_with_fewer_partitions_than_asked_are_said_not_ready_and_grown_with_grow(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = fleet_settings(settings, tmp_path)
    asyncio.run(existing_one_partition(fleet))
    code, output = topics(fleet, "--partitions", "4")
    assert code == 1, output
    assert "topics ready" not in output and fleet.requests_topic in output and "1 partition" in output, output
    assert asyncio.run(partitions(fleet))[fleet.requests_topic] == 1  # not changed without --grow

    code, output = topics(fleet, "--partitions", "4", "--grow")
    assert code == 0, output
    assert "per-key order" in output, output  # the consequence of growing, said
    found = asyncio.run(grown(fleet, 4))
    assert all(count >= 4 for count in found.values()), found
    assert found[fleet.requests_topic] == found[f"{fleet.requests_topic}.urgent"] == 4, found


def test_doctor_fails_on_queue_topics_with_fewer_partitions_than_the_fleet_has_slots(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = fleet_settings(settings, tmp_path, topic_partitions=4)
    asyncio.run(existing_one_partition(fleet))
    code, _ = topics(fleet)  # makes the claims topic; the others exist with 1 partition
    result = runner.invoke(app, ["doctor"], env=settings_environment(fleet))
    line = next(line for line in result.output.splitlines() if line[5:].startswith("topics"))
    assert line.startswith("FAIL"), result.output
    assert fleet.requests_topic in line and "4" in line, line


def test_doctor_warns_without_topic_partitions_when_the_queue_has_fewer_partitions_than_this_hosts_slots(
    settings: Settings, tmp_path: Path
) -> None:
    fleet = fleet_settings(settings, tmp_path, job_slots=2, gpus=[])
    asyncio.run(existing_one_partition(fleet))
    topics(fleet, "--partitions", "1")  # the claims topic
    result = runner.invoke(app, ["doctor"], env=settings_environment(fleet))
    line = next(line for line in result.output.splitlines() if line[5:].startswith("topics"))
    assert line.startswith("WARN") and "2 slot(s)" in line and fleet.requests_topic in line, result.output
    assert fleet.claims_topic not in line.split(":", 1)[1].split(";")[0] or "(16)" not in line, (
        line
    )  # 16 partitions: enough


async def made(settings: Settings, *topics: NewTopic) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        await admin.create_topics(list(topics))
        while not {topic.name for topic in topics} <= set(await admin.list_topics()):
            await asyncio.sleep(0.05)  # the controller answers before every broker lists them
    finally:
        await admin.close()


def test_the_state_topic_takes_the_partitions_the_events_topic_has(settings: Settings, tmp_path: Path) -> None:
    fleet = fleet_settings(settings, tmp_path)
    asyncio.run(made(fleet, NewTopic(fleet.events_topic, 4, 1)))
    code, output = topics(fleet, "--partitions", "2")
    assert code == 0, output
    # The keeper of events partition 3 writes to state partition 3.
    assert f"created {fleet.state_topic} (4 partitions)" in output, output
