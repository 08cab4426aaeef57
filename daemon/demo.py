"""`adapterd demo`: the main job on built-in defaults, on a fresh machine, with nothing configured.

Starts a local Kafka broker, builds a tiny model locally, runs the daemon, submits one SFT request
on inline rows, prints the events as they arrive, and leaves the adapter in a local folder.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
from pathlib import Path

from aiokafka import AIOKafkaProducer

from daemon.event_reader import follow_events
from daemon.kafka_options import kafka_options
from daemon.local_kafka import LocalKafka
from daemon.logs import configure_logging
from daemon.service import Service
from daemon.settings import Settings
from daemon.topics import ensure_topics
from schemas import SFTRequest, Succeeded

DEMO_ROWS = [
    {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    for q, a in [
        ("What is the capital of France?", "The capital of France is Paris."),
        ("What is two plus two?", "Two plus two equals four."),
        ("What does adapterd do?", "adapterd trains adapters from a stream of requests."),
        ("Where are the requests kept?", "Kafka keeps the requests."),
        ("Where are the adapters kept?", "The Hub keeps the adapters."),
        ("What is three plus five?", "Three plus five equals eight."),
        ("Is the fox quick?", "yes, the quick brown fox jumps over the lazy dog."),
        ("Is the dog lazy?", "yes, the dog is lazy."),
    ]
]


def demo_request(model_dir: Path, request_id: str = "demo-sft-1") -> SFTRequest:
    return SFTRequest.model_validate({
        "request_id": request_id,
        "method": "sft",
        "model": {"id": str(model_dir)},
        "dataset": {"rows": DEMO_ROWS},
        "peft": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        "training": {"max_steps": 10, "learning_rate": 5e-3, "per_device_train_batch_size": 4},
        "output": {"repo_id": "demo/tiny-sft-adapter"},
        "metadata": {"source": "adapterd demo"},
    })


def build_tiny_model(model_dir: Path) -> None:
    """In a child interpreter: building the model imports torch, which the daemon never does."""
    if not (model_dir / "config.json").exists():
        subprocess.run([sys.executable, "-m", "handlers.tiny_model", str(model_dir)], check=True, capture_output=True)


async def run_demo(work_dir: Path) -> bool:
    work_dir = work_dir.resolve()
    print(f"adapterd demo: working in {work_dir}")
    shutil.rmtree(work_dir / "kafka", ignore_errors=True)  # each demo starts from empty topics
    broker = LocalKafka(data_dir=work_dir / "kafka")
    print("starting a local Kafka broker (the first run fetches its jars with Maven)...")
    await asyncio.to_thread(broker.start)
    try:
        settings = Settings(
            bootstrap_servers=broker.bootstrap_servers,
            work_dir=work_dir,
            allowed_local_model_roots=[work_dir],
            hub_token=None,
            progress_interval_s=0,
            group_id="adapterd-demo",
            metrics_address=None,  # the demo runs beside whatever already listens on this machine
        )
        await ensure_topics(settings)
        model_dir = work_dir / "tiny-model"
        print(f"building a tiny Qwen2 model in {model_dir}...")
        await asyncio.to_thread(build_tiny_model, model_dir)

        service = Service(settings)
        daemon = asyncio.create_task(service.run(), name="daemon")
        request = demo_request(model_dir)
        producer = AIOKafkaProducer(**kafka_options(settings), acks="all", enable_idempotence=True)
        await producer.start()
        try:
            await producer.send_and_wait(settings.requests_topic, request.model_dump_json().encode(), key=request.request_id.encode())
        finally:
            await producer.stop()
        print(f"submitted request {request.request_id}; events:")

        succeeded = False
        async for event in follow_events(settings, request.request_id):
            details = event.model_dump(exclude={"schema_version", "event_id", "request_id", "host", "metadata", "type", "time", "attempt"})
            print(f"  {event.type:<10} {details}")
            succeeded = isinstance(event, Succeeded)
            if succeeded:
                print(f"the adapter is in {event.location}")
        service.request_stop()
        await daemon
        return succeeded
    finally:
        await asyncio.to_thread(broker.stop)


def main(work_dir: Path, log_format: str = "console") -> int:
    configure_logging("console" if log_format == "console" else "json", "warning")
    return 0 if asyncio.run(run_demo(work_dir)) else 1
