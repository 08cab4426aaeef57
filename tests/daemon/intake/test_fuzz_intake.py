"""Two thousand malformed messages through the running daemon: each is rejected with a reason and
dead-lettered, and the daemon goes on to accept the valid request behind them."""

from pathlib import Path

from aiokafka import AIOKafkaProducer

from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import Accepted, Rejected, Rejection, decode_request, parse_event
from testbed.client import read_records, submit
from testbed.processes import DaemonProcess
from tests.fuzz import malformed_messages
from tests.helpers import sft_request


async def test_the_daemon_rejects_every_malformed_message_and_keeps_serving(settings: Settings, tmp_path: Path) -> None:
    messages = [raw for raw in malformed_messages(2000, seed=7) if isinstance(decode_request(raw), Rejection)]
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all", linger_ms=20)
    await producer.start()
    try:
        for raw in messages:
            await producer.send(settings.requests_topic, raw)
        await producer.flush()
    finally:
        await producer.stop()
    await submit(settings, sft_request("after-the-fuzz"))

    # Without a warm child, so the test ends at `accepted` rather than waiting for a training process.
    daemon = DaemonProcess(settings.model_copy(update={"warm_child": False}), tmp_path / "daemon.log").start()
    try:
        events = [
            parse_event(r.value)
            for r in await read_records(settings, settings.events_topic, len(messages) + 1, timeout_s=120)
        ]
        dead_letters = await read_records(settings, settings.dlq_topic, len(messages), timeout_s=60)
    finally:
        daemon.stop()
    rejected = [e for e in events if isinstance(e, Rejected)]
    assert len(messages) > 1500 and len(rejected) == len(messages) == len(dead_letters)
    assert all(e.reason and e.errors and all(error.message for error in e.errors) for e in rejected)
    assert isinstance(events[-1], Accepted) and events[-1].request_id == "after-the-fuzz"
    assert dead_letters[0].value == messages[0]  # byte for byte
