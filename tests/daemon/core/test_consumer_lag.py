"""`ConsumerLag` (daemon/kafka/admin/lag.py) on the in-memory consumer: each partition's lag counts from its
running job's request when it has one (not committed until the job ends), else from the consumer's
position; it is measured at most every LAG_INTERVAL_S, and the end offsets it read are returned."""

from __future__ import annotations

from aiokafka import TopicPartition

from daemon.kafka.admin.lag import LAG_INTERVAL_S, ConsumerLag
from daemon.ops import metrics
from testbed.memory_kafka import FakeConsumer

FREE, BUSY = TopicPartition("requests", 0), TopicPartition("requests", 1)


def lag(tp: TopicPartition) -> float:
    return float(metrics.CONSUMER_LAG.labels(str(tp.partition))._value.get())


async def test_lag_counts_from_a_running_jobs_request_else_the_position_and_is_measured_once_an_interval() -> None:
    consumer = FakeConsumer()
    consumer.committed.update({FREE: 2, BUSY: 4})  # the consumer's positions
    consumer.ends.update({FREE: 5, BUSY: 9})
    meter = ConsumerLag(consumer)

    ends = await meter.measure(1000.0, lambda tp: 3 if tp == BUSY else None)
    assert ends == {FREE: 5, BUSY: 9}
    assert lag(FREE) == 3 and lag(BUSY) == 6  # the running job's request (offset 3) still counts

    consumer.ends[FREE] = 8
    assert await meter.measure(1000.0 + LAG_INTERVAL_S - 0.1, lambda tp: None) is None  # too soon: nothing read
    assert lag(FREE) == 3
    assert await meter.measure(1000.0 + LAG_INTERVAL_S, lambda tp: None) == {FREE: 8, BUSY: 9}
    assert lag(FREE) == 6 and lag(BUSY) == 5


async def test_nothing_is_measured_before_partitions_are_assigned() -> None:
    assert await ConsumerLag(FakeConsumer()).measure(1000.0, lambda tp: None) is None
