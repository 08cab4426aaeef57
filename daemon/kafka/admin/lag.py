"""Consumer lag per partition (the `adapterd_consumer_lag` gauge), from the brokers' end offsets at
most every LAG_INTERVAL_S: a paused partition fetches nothing, so its high watermark would go stale
while its job runs. The end offsets measured also tell the scheduler which waiting retries have
requests behind them (`Scheduler.wake`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from aiokafka import TopicPartition

from daemon.kafka.clients import Consumer
from daemon.ops import metrics

LAG_INTERVAL_S = 5.0


class ConsumerLag:
    def __init__(self, consumer: Consumer) -> None:
        self.consumer = consumer
        self.measured = 0.0  # time.monotonic() of the last measure

    async def measure(
        self, now: float, running: Callable[[TopicPartition], int | None]
    ) -> Mapping[TopicPartition, int] | None:
        """Each assigned partition's lag, counted from `running(tp)` (the offset of its running job's
        request, which counts until the job ends and commits it) or else the consumer's position; the
        end offsets, when measured (None within LAG_INTERVAL_S of the last measure, or with nothing assigned)."""
        if now - self.measured < LAG_INTERVAL_S or not self.consumer.assignment():
            return None
        self.measured = now
        assigned = list(self.consumer.assignment())
        ends = await self.consumer.end_offsets(assigned)
        for tp in assigned:
            held = running(tp)
            next_offset = held if held is not None else await self.consumer.position(tp)
            metrics.CONSUMER_LAG.labels(str(tp.partition)).set(max(0, ends[tp] - next_offset))
        return ends
