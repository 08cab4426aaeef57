"""Create adapterd's topics if they are missing (for the demo, the tests, and `adapterd topics`)."""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from daemon.settings import Settings


async def ensure_topics(settings: Settings, partitions: int = 1, replication_factor: int = 1) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        names = [settings.requests_topic, settings.events_topic, settings.dlq_topic, settings.control_topic]
        missing = [NewTopic(name, partitions, replication_factor) for name in names if name not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another process created them meanwhile
    finally:
        await admin.close()
