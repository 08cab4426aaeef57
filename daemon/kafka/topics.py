"""Create adapterd's topics if they are missing (for the demo, the tests, and `adapterd topics`).

The priority classes' topics are made with `message.timestamp.type=LogAppendTime`: the broker stamps each
record with the time it had it, so a request's place in the fleet's order is its arrival, never its
producer's own clock (daemon/fleet/arrival.py). A topic that exists is left as it is.
"""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from daemon.errors import TopicMissing
from daemon.kafka.options import kafka_options
from daemon.settings import Settings

CLAIMS_PARTITIONS = 16  # the claims topic made here: enough for a small fleet's slots
ARRIVAL_STAMPED = {"message.timestamp.type": "LogAppendTime"}  # a class topic's: the broker says when a request came


async def ensure_topics(settings: Settings, partitions: int = 1, replication_factor: int = 1) -> None:
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    try:
        await admin.start()  # inside: a broker that does not answer leaves no client open
        existing = set(await admin.list_topics())
        names = [settings.requests_topic, settings.events_topic, settings.dlq_topic, settings.control_topic, *settings.class_topics.values()]
        queues = set(settings.class_topics.values())
        missing = [NewTopic(name, partitions, replication_factor, topic_configs=ARRIVAL_STAMPED if name in queues else None)
                   for name in dict.fromkeys(names) if name not in existing]
        if settings.class_topics and settings.claims_topic not in existing:
            # One job per claims partition: at least as many as the fleet has slots (deploy/README.md).
            missing.append(NewTopic(settings.claims_topic, max(partitions, CLAIMS_PARTITIONS), replication_factor))
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them meanwhile
    finally:
        await admin.close()


async def partition_numbers(settings: Settings, topic: str) -> set[int]:
    """The partitions of a topic; TopicMissing (a LookupError) naming it when it does not exist."""
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    try:
        await admin.start()
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    numbers = {partition["partition"] for entry in described if entry["topic"] == topic for partition in entry["partitions"]}
    if not numbers:
        raise TopicMissing(f"topic {topic} does not exist on {settings.bootstrap_servers}; create it (adapterd topics)")
    return numbers
