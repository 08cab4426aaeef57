"""A producer and a consumer need only pydantic, aiokafka and adapterd's `schemas/` (the consumer, which
checks the fleet's signatures, cryptography too): the two examples in docs/examples run against a real broker with torch, transformers, TRL, PEFT, datasets, accelerate,
huggingface_hub and the daemon's own packages made unimportable. The consumer deploys only what says
`published: "main"`, and reads a newer daemon's fields and event types without stopping."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import SIGNATURE_HEADER
from schemas.signing import EventSigner, new_key_pair, read_private_key
from testbed.client import read_records
from tests.helpers import event_document, sft_request

ROOT = Path(__file__).parents[2]
TRAINING_STACK = ("torch", "transformers", "trl", "peft", "datasets", "accelerate", "bitsandbytes", "huggingface_hub", "daemon", "handlers")
# Runs an example with the training stack (and adapterd's daemon and handlers) unimportable: an import of any raises ImportError.
RUNNER = f"""
import runpy, sys
for name in {TRAINING_STACK!r}:
    sys.modules[name] = None
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def example(name: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUNNER, str(ROOT / "docs" / "examples" / name), *argv],
                          cwd=ROOT, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)


async def test_the_producer_publishes_a_checked_request_keyed_by_its_id(settings: Settings, tmp_path: Path) -> None:
    good, bad = tmp_path / "request.json", tmp_path / "bad.json"
    good.write_text(json.dumps(sft_request("from-a-producer")))
    bad.write_text(json.dumps(sft_request("bad", training={"max_steps": "8"})))
    refused = example("producer.py", settings.bootstrap_servers, str(bad), settings.requests_topic)
    assert refused.returncode == 1 and "training.max_steps" in refused.stderr
    published = example("producer.py", settings.bootstrap_servers, str(good), settings.requests_topic)
    assert published.returncode == 0, published.stderr
    [record] = await read_records(settings, settings.requests_topic, 1)  # the bad one was never sent
    assert record.key == b"from-a-producer" and record.value == good.read_bytes()


async def test_the_consumer_deploys_only_what_was_published_to_main(settings: Settings, tmp_path: Path) -> None:
    newer: dict[str, Any] = {**event_document("succeeded", request_id="newer", published="main"), "deployment_hint": "gpu"}  # a later field
    newer["evaluation"] = {**newer["evaluation"], "calibration": 0.9}  # and one deeper in
    events = [
        event_document("succeeded", request_id="passed", published="main", revision="main", duplicate=False),
        event_document("succeeded", request_id="failed-gate", published="pr", revision="refs/pr/1"),
        event_document("succeeded", request_id="passed", published="main", revision="main", duplicate=True),
        {**event_document("accepted", request_id="later"), "type": "paused", "until": "tomorrow"},  # a later type
        newer,
        event_document("failed", request_id="last"),
    ]
    pem, public = new_key_pair()  # the fleet's key: the consumer takes only what it signed (test_signed_events_e2e.py: forged ones)
    fleet = EventSigner(read_private_key(pem))
    (tmp_path / "keys").write_text(public + "\n")
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        for document in events:
            value = json.dumps(document).encode()
            await producer.send_and_wait(settings.events_topic, value, key=document["request_id"].encode(),
                                         headers=[(SIGNATURE_HEADER, fleet.sign(value))])
    finally:
        await producer.stop()
    consumed = example("consumer.py", settings.bootstrap_servers, "deployers", str(tmp_path / "keys"), "last", settings.events_topic)
    assert consumed.returncode == 0, consumed.stderr
    lines = consumed.stdout.splitlines()
    assert [line.split()[1] for line in lines if line.startswith("deploy ")] == [f"{events[0]['repo_id']}@main", f"{newer['repo_id']}@{newer['revision']}"]
    assert "not deployed: failed-gate was published to pr" in lines and "not deployed: passed was published to main (a repeat)" in lines
