"""Create adapterd's topics if they are missing (for the demo, the tests, and `adapterd topics`).

Every topic the settings name is asked for once, with the operator's partitions, and the broker's answer
for each is read: a topic the broker refuses is named with its reason, never taken as made. A topic that
exists with fewer partitions than asked is said, and grown only when asked to (`grow`): Kafka maps a key
to `hash(key) % partitions`, so after growth a key may map to another partition and per-key order holds
only among records written after it.

The priority classes' topics are made with `message.timestamp.type=LogAppendTime`: the broker stamps each
record with the time it had it, so a request's place in the fleet's order is its arrival, never its
producer's own clock (daemon/fleet/choice.py `Arrivals`).

The state topic (the table of requests, daemon/table/) is made compacted (`COMPACTED`), with the events topic's
partitions (the keeper of events partition p writes its entries to state partition p): as many as it has when it
exists, else as many as asked for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError, for_code

from daemon.errors import ConfigError, TopicMissing
from daemon.kafka.options import kafka_options
from daemon.settings import Settings

CLAIMS_PARTITIONS = 16  # the claims topic made here: enough for a small fleet's slots
ARRIVAL_STAMPED = {"message.timestamp.type": "LogAppendTime"}  # a class topic's: the broker says when a request came
# The state topic's (the table of requests, daemon/table/topic.py names it there too): compaction keeps each key's
# latest record; the active segment rolls every hour (`segment.ms`) so a quiet table compacts too (the cleaner never
# touches the active segment); a tombstone stays a day (`delete.retention.ms`) so a reader part-way through sees it.
# Defined here, in the Kafka layer, because `adapterd topics` makes the topic with it below the table's layer.
COMPACTED = {
    "cleanup.policy": "compact",
    "segment.ms": str(3_600_000),
    "min.cleanable.dirty.ratio": "0.1",
    "delete.retention.ms": str(86_400_000),
}
LISTED_WITHIN_S = 10.0  # how long `make_topics` waits for the brokers to list what it made
GROWTH = "a key may map to another partition after growth: per-key order holds only for records written after it"


class TopicsRefused(ConfigError):
    """The broker refused to create or grow a topic; the message names each and the broker's reason."""


@dataclass
class TopicsMade:
    """What `make_topics` found and did, topic by topic."""

    created: dict[str, int] = field(default_factory=dict)  # name: partitions
    existing: dict[str, int] = field(default_factory=dict)  # name: partitions, at least those asked
    short: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # name: (partitions it has, partitions asked), not grown
    grown: dict[str, tuple[int, int]] = field(default_factory=dict)  # name: (partitions it had, partitions now)
    refused: dict[str, str] = field(default_factory=dict)  # name: the broker's reason


def wanted(settings: Settings, partitions: int) -> dict[str, int]:
    """Each topic the settings name, once (the default class's queue is the requests topic
    itself), with its partitions."""
    names = [
        settings.requests_topic,
        settings.events_topic,
        settings.dlq_topic,
        settings.control_topic,
        *settings.class_topics.values(),
    ]
    topics = dict.fromkeys([*names, settings.state_topic], partitions)
    if settings.class_topics:
        # One job per claims partition: at least as many as the fleet has slots (deploy/README.md).
        topics.setdefault(settings.claims_topic, max(partitions, CLAIMS_PARTITIONS))
    return topics


async def make_topics(
    settings: Settings, partitions: int = 1, replication_factor: int = 1, grow: bool = False
) -> TopicsMade:
    """Create the missing topics, read the broker's answer for each, and say (or with `grow`, grow)
    those with too few partitions."""
    asked = wanted(settings, partitions)
    queues = set(settings.class_topics.values())
    made = TopicsMade()
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    try:
        await admin.start()  # inside: a broker that does not answer leaves no client open
        have = await _partitions(admin, list(asked))
        # The table's partitions are the events topic's, as it is or as it is made.
        asked[settings.state_topic] = max(asked[settings.state_topic], have.get(settings.events_topic, 0))
        configs = {**dict.fromkeys(queues, ARRIVAL_STAMPED), settings.state_topic: COMPACTED}
        missing = [
            NewTopic(name, count, replication_factor, topic_configs=configs.get(name))
            for name, count in asked.items()
            if name not in have
        ]
        if missing:
            response = await admin.create_topics(missing)
            for name, reason in _errors(response.topic_errors).items():
                if reason is None or reason[0] is TopicAlreadyExistsError:
                    continue  # made, or another process made it meanwhile: its partitions are read below
                made.refused[name] = reason[1]
            have |= await _partitions(admin, [topic.name for topic in missing if topic.name not in made.refused])
            made.created = {
                topic.name: have.get(topic.name, topic.num_partitions)
                for topic in missing
                if topic.name not in made.refused
            }
        for name, count in asked.items():
            if name in made.refused or name in made.created:
                continue
            if have[name] >= count:
                made.existing[name] = have[name]
            elif not grow:
                made.short[name] = (have[name], count)
            else:
                try:
                    await admin.create_partitions({name: NewPartitions(count)})
                    made.grown[name] = (have[name], count)
                except KafkaError as exc:  # create_partitions raises the broker's per-topic error itself
                    made.refused[name] = str(exc) or type(exc).__name__
        await _listed(admin, {**made.created, **{name: now for name, (_, now) in made.grown.items()}})
    finally:
        await admin.close()
    return made


async def ensure_topics(settings: Settings, partitions: int = 1, replication_factor: int = 1) -> None:
    """`make_topics` for the demo, the tests and the benchmarks: TopicsRefused naming each topic the broker refused."""
    made = await make_topics(settings, partitions, replication_factor)
    if made.refused:
        raise TopicsRefused("; ".join(f"topic {name}: {reason}" for name, reason in made.refused.items()))


def _errors(topic_errors: list[tuple[object, ...]]) -> dict[str, tuple[type[KafkaError], str] | None]:
    """The CreateTopics answer, topic by topic: None where it was made, else the error's class and its reason."""
    found: dict[str, tuple[type[KafkaError], str] | None] = {}
    for entry in topic_errors:
        name, code = str(entry[0]), int(entry[1])  # type: ignore[call-overload]
        message = entry[2] if len(entry) > 2 and entry[2] else None  # versions 1 and later carry the broker's message
        error = for_code(code)
        found[name] = None if code == 0 else (error, f"{error.__name__}: {message or error.description}")
    return found


async def _listed(admin: AIOKafkaAdminClient, expected: dict[str, int]) -> None:
    """Wait, at most LISTED_WITHIN_S, until the brokers' metadata lists what the controller made: it answers first, and
    a `doctor` or a daemon started at once would otherwise find a topic "created" missing. Kafka has no notice of it to
    await."""
    if not expected:
        return
    with contextlib.suppress(TimeoutError):  # said as made all the same: the controller made it
        async with asyncio.timeout(LISTED_WITHIN_S):
            while True:
                have = await _partitions(admin, list(expected))
                if all(have.get(name, 0) >= want for name, want in expected.items()):
                    return
                await asyncio.sleep(0.1)


async def _partitions(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """The partitions of those of `names` that exist. Only topics the cluster lists are described: aiokafka's
    describe_topics is a metadata request that lets a broker with auto.create.topics.enable make a topic it names,
    with the broker's default partitions, which is the very defect `adapterd topics` must not have."""
    existing = set(await admin.list_topics())
    names = [name for name in names if name in existing]
    if not names:
        return {}
    described = await admin.describe_topics(names)
    return {entry["topic"]: len(entry["partitions"]) for entry in described if entry.get("partitions")}


async def partition_counts(settings: Settings, names: list[str]) -> dict[str, int]:
    """The partitions of those of `names` that exist (a missing one left out, never made by asking)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    try:
        await admin.start()
        return await _partitions(admin, names)
    finally:
        await admin.close()


async def topic_config(settings: Settings, name: str) -> dict[str, str]:
    """The configuration of an existing topic, as the brokers report it (their defaults included)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    try:
        await admin.start()
        return await described_config(admin, name)
    finally:
        await admin.close()


async def described_config(admin: AIOKafkaAdminClient, name: str) -> dict[str, str]:
    """`topic_config` through an admin client already started."""
    [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    found: dict[str, str] = {}
    for resource in response.resources:  # (error code, message, type, name, entries)
        code, message, entries = int(resource[0]), resource[1], resource[4]
        if code:
            error = for_code(code)
            raise error(f"describing topic {name}'s configuration: {message or error.description}")
        found |= {str(entry[0]): str(entry[1]) for entry in entries if entry[1] is not None}
    return found


async def partition_numbers(settings: Settings, topic: str) -> set[int]:
    """The partitions of a topic; TopicMissing (a LookupError) naming it when it does not
    exist (never made by asking)."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    try:
        await admin.start()
        return await topic_partitions(admin, settings, topic)
    finally:
        await admin.close()


async def topic_partitions(admin: AIOKafkaAdminClient, settings: Settings, topic: str) -> set[int]:
    """`partition_numbers` with an admin client already open."""
    described = await admin.describe_topics([topic]) if topic in set(await admin.list_topics()) else []
    numbers = {
        partition["partition"] for entry in described if entry["topic"] == topic for partition in entry["partitions"]
    }
    if not numbers:
        raise TopicMissing(f"topic {topic} does not exist on {settings.bootstrap_servers}; create it (adapterd topics)")
    return numbers
