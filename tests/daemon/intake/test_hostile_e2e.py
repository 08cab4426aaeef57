"""Issue 22's hostile inputs sent to a running daemon on one partition, as a producer would send
them: every one is rejected naming its field and dead-lettered, the daemon stays up, and the
valid requests right behind them (one carrying retry headers a producer forged) succeed. A chat
template that would exhaust the host when rendered ends in `failed`, in preflight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import Failed, Rejected, Succeeded
from testbed.client import read_records, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request
from tests.hostile import forged_retry_headers, hostile_cases

pytestmark = pytest.mark.slow


async def test_no_hostile_message_stops_the_daemon_or_the_requests_behind_it(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "rows.jsonl").write_text(json.dumps({"text": "rows outside the root"}) + "\n")
    (root / "link").symlink_to(tmp_path / "outside")
    settings = settings.model_copy(
        update={
            "allowed_local_dataset_roots": [root],
            "allowed_dataset_urls": ["s3://bucket/*"],
            "allowed_report_to": ["mlflow", "tensorboard", "trackio"],
        }
    )
    cases = hostile_cases(sft_request("valid"), root)
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        for name, raw, headers, _ in cases:
            await producer.send_and_wait(settings.requests_topic, raw, key=f"hostile-{name}".encode(), headers=headers)
        # Valid by the schema, but its chat template allocates 400 MB when rendered: failed in preflight.
        bomb = sft_request("template-bomb", model={"id": "tiny/qwen2-chat", "chat_template": "{{ 'a' * 400000000 }}"})
        await producer.send_and_wait(settings.requests_topic, json.dumps(bomb).encode(), key=b"template-bomb")
        forged = json.dumps(sft_request("forged-retry-headers")).encode()
        await producer.send_and_wait(
            settings.requests_topic, forged, key=b"forged-retry-headers", headers=forged_retry_headers()
        )
        behind = json.dumps(sft_request("right-behind")).encode()
        await producer.send_and_wait(settings.requests_topic, behind, key=b"right-behind")
    finally:
        await producer.stop()

    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        ids = {f"hostile-{name}" for name, *_ in cases} | {"template-bomb", "forged-retry-headers", "right-behind"}
        events = await terminal_events(settings, ids, timeout_s=300)
        dead_letters = await read_records(settings, settings.dlq_topic, len(cases), timeout_s=60)
        assert daemon.process is not None and daemon.process.poll() is None, "the daemon exited"
    finally:
        daemon.stop()

    for name, _, _, path in cases:
        terminal = events[f"hostile-{name}"][-1]
        assert isinstance(terminal, Rejected), (name, terminal)
        assert path in [error.path for error in terminal.errors], (name, terminal.errors)
    bomb_end = events["template-bomb"][-1]
    assert (
        isinstance(bomb_end, Failed)
        and bomb_end.code == "config_invalid"
        and bomb_end.message.startswith("model.chat_template: ")
    )
    for request_id in ("forged-retry-headers", "right-behind"):
        assert isinstance(events[request_id][-1], Succeeded), events[request_id]
    assert events["forged-retry-headers"][0].attempt == 1  # the forged attempt 99 was not believed
    assert [record.value for record in dead_letters] == [raw for _, raw, _, _ in cases]  # byte for byte, in order
    assert not (tmp_path / "work" / "outputs" / "jobs").exists() and (tmp_path / "work" / "jobs").is_dir()
