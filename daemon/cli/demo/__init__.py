"""`adapterd demo [--method NAME]`: the main job on built-in defaults, on a fresh machine, with nothing configured.

Starts a local Kafka broker, builds a tiny model locally, runs the daemon, submits one request of
the method (SFT unless named; `sft-vision`, `dpo-vision`, `grpo-vision` train a tiny
vision-language model on rows with images; `grpo-math` trains GRPO on sums, scored by TRL's accuracy
reward) on inline rows, follows it with a progress bar (loss, ETA) and a line
per event, and ends with where the adapter is and the three lines of Python that load it. With
`--gate`, two SFT requests judged by a gate before publishing: one passes (to main), and one on a
copy of the tiny model poisoned with NaN, whose every loss is NaN, fails (into a pull request: on
the local sink, a folder of its own beside main's). With `--keep`, the broker and the daemon keep
running afterwards, the daemon serving its endpoint (status, health, job logs) on a free port, with
a settings file beside the work (broker, endpoint, logs token) and the commands, as typed in the
project's folder, to submit, list, inspect, read the log of, follow and cancel requests against them
(daemon/cli/demo/keep.py).
"""

from __future__ import annotations

import asyncio
import difflib
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

from aiokafka import AIOKafkaProducer

from daemon.admission.capabilities import available_methods, unsupported_reason
from daemon.cli.console import follow_to_end
from daemon.cli.demo.keep import keep_running
from daemon.cli.demo.requests import (
    demo_request,
    gated_demo_requests,
    is_vision,
    known_methods,
    method_of,
    nan_model_dir,
    teacher_dir,
)
from daemon.cli.keys import PRIVATE_NAME, make_key_pair
from daemon.hub.local_sink import local_pull_request, local_target
from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.event_reader import EventStream
from daemon.kafka.options import kafka_options
from daemon.local_broker import LocalKafka, free_port
from daemon.ops.logs import configure_logging
from daemon.service import Service
from daemon.settings import Settings
from schemas import RequestBase


def build_tiny_model(model_dir: Path, builder: str = "handlers.fixtures.tiny_model", *args: str) -> None:
    """In a child interpreter: building the model imports torch, which the daemon never does."""
    if not (model_dir / "config.json").exists():
        subprocess.run([sys.executable, "-m", builder, str(model_dir), *args], check=True, capture_output=True)


def loading_snippet(request: RequestBase, adapter_dir: Path, vision: bool = False) -> str:
    """Three lines of Python that load the adapter onto its base model with PEFT (and, for a
    vision-language model, a fourth that loads its processor)."""
    if vision:
        return (
            f"from peft import PeftModel\n"
            f"from transformers import AutoModelForImageTextToText, AutoProcessor\n"
            "model = PeftModel.from_pretrained("
            f"AutoModelForImageTextToText.from_pretrained({str(request.model.id)!r}), {str(adapter_dir)!r})\n"
            f"processor = AutoProcessor.from_pretrained({str(adapter_dir)!r})\n"
        )
    if request.method == "reward":  # a sequence-classification head, one score
        loader, kwargs = "AutoModelForSequenceClassification", ", num_labels=1"
    else:
        loader, kwargs = "AutoModelForCausalLM", ""
    return (
        f"from peft import PeftModel\n"
        f"from transformers import {loader}\n"
        f"model = PeftModel.from_pretrained({loader}.from_pretrained({str(request.model.id)!r}{kwargs}), "
        f"{str(adapter_dir)!r})\n"
    )


async def submit(settings: Settings, request: RequestBase) -> None:
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(
            settings.requests_topic, request.model_dump_json().encode(), key=request.request_id.encode()
        )
    finally:
        await producer.stop()


def demo_keys(work_dir: Path) -> Path:
    """The demo's event-signing key pair (`adapterd keys`), made once in work_dir/event-keys; the private key's path."""
    folder = work_dir / "event-keys"
    if not (folder / PRIVATE_NAME).exists():
        shutil.rmtree(folder, ignore_errors=True)  # a public key without its private key is of no use
        make_key_pair(folder)
    return folder / PRIVATE_NAME


async def run_demo(work_dir: Path, method: str, gate: bool = False, keep: bool = False) -> bool:
    work_dir = work_dir.resolve()
    print(f"adapterd demo ({method}): working in {work_dir}")
    shutil.rmtree(work_dir / "kafka", ignore_errors=True)  # each demo starts from empty topics
    broker = LocalKafka(data_dir=work_dir / "kafka")
    print("starting a local Kafka broker (the first run fetches its jars from Maven Central)...")
    await asyncio.to_thread(broker.start)
    try:
        settings = Settings(
            bootstrap_servers=broker.bootstrap_servers,
            work_dir=work_dir,
            allowed_local_model_roots=[work_dir],
            hub_token=None,
            progress_interval_s=0,
            group_id="adapterd-demo",
            # Kept, the daemon serves its endpoint (status, logs) on a free port of the loopback, beside
            # whatever holds the default 9464 on this machine; a demo that ends serves none.
            metrics_address=f"127.0.0.1:{free_port()}" if keep else None,
            logs_token=secrets.token_urlsafe(32) if keep else None,
            event_signing_key_file=demo_keys(work_dir),  # its events signed, and read back verified, as a fleet's are
        )
        await ensure_topics(settings)
        if is_vision(method):
            model_dir = work_dir / "tiny-vlm"
            print(f"building a tiny vision-language model (LLaVA) in {model_dir}...")
            await asyncio.to_thread(build_tiny_model, model_dir, "handlers.fixtures.tiny_vlm")
        else:
            model_dir = work_dir / "tiny-model"
            print(f"building a tiny Qwen2 model in {model_dir}...")
            await asyncio.to_thread(build_tiny_model, model_dir)
            if method in ("distillation", "gkd"):
                print(f"building its teacher, the same tiny model from another seed, in {teacher_dir(model_dir)}...")
                await asyncio.to_thread(build_tiny_model, teacher_dir(model_dir), "handlers.fixtures.tiny_model", "1")
            if gate:
                print(
                    "building the failing run's model, the same tiny model with a NaN final norm (every loss NaN), "
                    f"in {nan_model_dir(model_dir)}..."
                )
                await asyncio.to_thread(
                    build_tiny_model, nan_model_dir(model_dir), "handlers.fixtures.tiny_model", "--nan"
                )

        service = Service(settings)
        daemon = asyncio.create_task(service.run(), name="daemon")
        requests = gated_demo_requests(model_dir) if gate else [demo_request(method, model_dir)]
        outcomes = []
        try:
            for request in requests:
                async with EventStream(settings, from_end=True) as stream:  # positioned before the request exists
                    await submit(settings, request)
                    print(
                        f"submitted {request.method} request {request.request_id}; the daemon trains it (without a "
                        "Hub token, into a local folder):"
                    )
                    outcomes.append(await follow_to_end(stream, request.request_id))
            if keep and not any(outcomes):
                report(requests, settings, method, gate)
                await keep_running(settings, requests[-1])
                return True
        finally:
            service.request_stop()
            await daemon
        for request, outcome in zip(requests, outcomes, strict=False):
            if outcome != 0:
                print(f"the request did not succeed; the job's own log is in {settings.jobs_dir / request.request_id}")
                return False
        report(requests, settings, method, gate)
        return True
    finally:
        await asyncio.to_thread(broker.stop)


def report(requests: list[RequestBase], settings: Settings, method: str, gate: bool) -> None:
    """Where the demo's adapters are, and how to load one."""
    if gate:
        passed, failed = local_target(requests[0], settings), local_pull_request(requests[1], settings)
        print(
            f"\nthe adapter that passed its gate is in {passed} (main); the one trained on the NaN model failed it "
            f"and is in the pull request {failed}, beside main, not in it (with a Hub token, a pull request on the Hub)"
        )
        return
    request = requests[0]
    adapter_dir = local_target(request, settings)
    print(f"\nthe adapter is in {adapter_dir}\nload it with:\n")
    print(loading_snippet(request, adapter_dir, vision=is_vision(method)))


def method_problem(method: str) -> str | None:
    """Why the demo cannot run `method` on this host, naming those it can; None when it can."""
    available = ", ".join(available_methods()) or "none"
    if method not in known_methods():
        meant = difflib.get_close_matches(method.lower(), known_methods(), n=1, cutoff=0.6)
        return (
            f"unknown method {method!r}"
            + (f" (did you mean {meant[0]!r}?)" if meant else "")
            + f"; this host can run: {available}"
        )
    reason = unsupported_reason(method_of(method))
    return None if reason is None else f"{reason}; this host can run: {available}"


def main(work_dir: Path, method: str = "sft", gate: bool = False, keep: bool = False) -> int:
    problem = method_problem(method) or (
        "--gate shows the sft demo judged by a gate" if gate and method != "sft" else None
    )
    if problem is not None:
        print(f"adapterd demo: {problem}", file=sys.stderr)
        return 2
    configure_logging("console", "warning")
    return 0 if asyncio.run(run_demo(work_dir, method, gate, keep)) else 1
