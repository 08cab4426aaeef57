"""The topic reader behind the control topic steps past a record aiokafka cannot unpack (a header
name that is not UTF-8) instead of ending: the records around it are all read, none lost (issue 37).
On the real broker."""

from __future__ import annotations

from aiokafka import AIOKafkaProducer

from daemon.kafka.options import kafka_options
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from tests.hostile import NotUtf8, python_record_builder


async def test_the_reader_steps_past_an_unreadable_record_and_loses_none_around_it(settings: Settings) -> None:
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        for value in (b"one", b"two"):
            await producer.send_and_wait(settings.control_topic, value, partition=0)
        with python_record_builder():
            await producer.send_and_wait(
                settings.control_topic, b"unreadable", partition=0, headers=[(NotUtf8("x"), b"v")]
            )
        for value in (b"three", b"four"):
            await producer.send_and_wait(settings.control_topic, value, partition=0)
    finally:
        await producer.stop()
    async with TopicReader(settings, settings.control_topic) as reader:
        values = [record.value async for record in reader.records(follow=False)]
    assert values == [b"one", b"two", b"three", b"four"]
