"""Issue 61, "every codec Kafka has", end to end on the real broker. Requests produced by librdkafka
(confluent-kafka's wheel bundles it), the client most other producers use, with each codec Kafka has
(`compression.codec` gzip, snappy, lz4, zstd) train through a running daemon; and a batch the daemon
cannot decompress (its codec's library blocked in the daemon's process: a codec Kafka adds later, as
this host sees it) is dead-lettered by its offset and announced, and the request behind it on the same
partition trains, the daemon up throughout."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import aiokafka.codec
import pytest
from confluent_kafka import KafkaError, Message, Producer

from daemon.kafka.topic_reader import TopicReader
from daemon.ops import metrics
from daemon.settings import Settings
from schemas import Rejected, Succeeded
from testbed.client import read_records, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

pytestmark = pytest.mark.slow

CODECS = ("gzip", "snappy", "lz4", "zstd")

# Imported first by every Python process that has this folder on its path (`site` imports `sitecustomize`):
# cramjam, aiokafka's one library for snappy, lz4 and zstd, cannot be imported there.
NO_CRAMJAM = """
import sys


class NoCramjam:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "cramjam":
            raise ImportError(f"{name} is blocked in this process by the test")
        return None


sys.meta_path.insert(0, NoCramjam())
"""


def codec_request(request_id: str) -> bytes:
    """A two-step request, its metadata long and repetitive: every codec shrinks it, so librdkafka sends it
    compressed (it sends a batch as it is when compressing would not make it smaller)."""
    return json.dumps(
        sft_request(
            request_id,
            training={"max_steps": 2, "learning_rate": 1e-2, "per_device_train_batch_size": 2},
            metadata={"team": "tests", "note": "compressible " * 70},
        )
    ).encode()


def librdkafka_send(settings: Settings, codec: str, records: list[tuple[str, bytes]]) -> None:
    """Publish to partition 0 of the requests topic as a librdkafka producer configured with `codec` does: one
    batch, acknowledged by every replica; fails on any delivery error."""
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "compression.codec": codec, "acks": "all", "linger.ms": 0}
    )
    errors: list[KafkaError] = []

    def delivered(error: KafkaError | None, message: Message) -> None:
        if error is not None:
            errors.append(error)

    for key, value in records:
        producer.produce(settings.requests_topic, value=value, key=key.encode(), partition=0, on_delivery=delivered)
    assert producer.flush(30) == 0 and not errors, errors


async def until_decided_while_alive(daemon: DaemonProcess, deciding: Any) -> Any:
    """What `deciding` returns, failing at once if the daemon exits first (as main's did on such a batch)."""
    assert daemon.process is not None
    decided = asyncio.ensure_future(deciding)
    exited = asyncio.ensure_future(asyncio.to_thread(daemon.process.wait))
    await asyncio.wait([decided, exited], return_when=asyncio.FIRST_COMPLETED)
    if not decided.done():
        decided.cancel()
        pytest.fail(f"the daemon exited ({daemon.process.returncode}) before deciding; see {daemon.log_path}")
    exited.cancel()
    return decided.result()


async def test_a_request_in_each_codec_kafka_has_trains(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = shared_settings
    ids = {codec: f"codec-{codec}" for codec in CODECS}
    for codec, request_id in ids.items():
        await asyncio.to_thread(librdkafka_send, settings, codec, [(request_id, codec_request(request_id))])

    # Each batch really is compressed with its codec: a reader in this process without cramjam reads the gzip one
    # and steps past the other three (the event and control readers' step-past, on the real broker), counting them.
    counted = metrics.UNREADABLE_RECORDS.labels(settings.requests_topic, "UnsupportedCodecError")
    before = counted._value.get()
    with monkeypatch.context() as patched:
        patched.setattr(aiokafka.codec, "cramjam", None)
        async with asyncio.timeout(60), TopicReader(settings, settings.requests_topic) as reader:
            read = [record.key async for record in reader.records(follow=False)]
    assert [key for key in read if key in {i.encode() for i in ids.values()}] == [b"codec-gzip"]
    assert counted._value.get() == before + 3

    events = await until_decided_while_alive(shared_daemon, terminal_events(settings, set(ids.values()), timeout_s=300))
    for request_id in ids.values():
        assert isinstance(events[request_id][-1], Succeeded), events[request_id]


async def test_a_batch_the_daemon_cannot_decompress_is_dead_lettered_and_the_request_behind_it_trains(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "no-cramjam"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(NO_CRAMJAM)
    await asyncio.to_thread(librdkafka_send, settings, "lz4", [("in-lz4", codec_request("in-lz4"))])  # offset 0
    await asyncio.to_thread(
        librdkafka_send, settings, "gzip", [("behind-lz4", codec_request("behind-lz4"))]
    )  # offset 1

    path = os.pathsep.join(filter(None, [str(blocker), os.environ.get("PYTHONPATH")]))
    daemon = DaemonProcess(settings, tmp_path / "daemon.log", extra_env={"PYTHONPATH": path}).start()
    try:
        events = await until_decided_while_alive(daemon, terminal_events(settings, {None, "behind-lz4"}, timeout_s=300))
        [letter] = await read_records(settings, settings.dlq_topic, 1, timeout_s=60)
        assert daemon.process is not None and daemon.process.poll() is None, "the daemon exited"
    finally:
        daemon.stop()

    headers = dict(letter.headers)
    assert headers["adapterd-exception"] == b"UnsupportedCodecError", (
        headers
    )  # the codec's library was blocked in the daemon
    assert (
        headers["adapterd-source-topic"],
        headers["adapterd-source-partition"],
        headers["adapterd-source-offset"],
    ) == (settings.requests_topic.encode(), b"0", b"0")
    assert letter.value == b"" and letter.key is None  # not read: its bytes are where the headers say
    [rejected] = events[None]
    assert isinstance(rejected, Rejected) and rejected.reason == "invalid", rejected
    message = rejected.errors[0].message
    assert "lz4" in message and "codec" in message and f"offset 0 of {settings.requests_topic}/0" in message, message
    assert isinstance(events["behind-lz4"][-1], Succeeded), events["behind-lz4"]
