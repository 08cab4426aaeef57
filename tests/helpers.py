"""Helpers the tests share: small valid requests to start from, rows in the formats pipelines write,
running a handler in-process, and checks that a pushed adapter trained. Publishing requests and
reading events back is `testbed.client`'s."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from aiokafka.partitioner import DefaultPartitioner

import schemas
from daemon.settings import Settings
from handlers.protocol import TrainResult
from testbed.client import submit, terminal_events
from testbed.data import CHAT_DATASET, HUB_TOKEN, TINY_MODEL

# A one-GPU SFT job's result as a child says it: what a test's scripted or remote child ends with.
TRAIN_RESULT = TrainResult(
    trainer="trl.SFTTrainer/trl.SFTConfig",
    metrics={"train_loss": 1.5},
    base_model_revision="a" * 40,
    dataset_fingerprint="f",
    durations_s={"train": 0.1},
    versions={"trl": "test"},
)


def parquet_bytes(rows: list[dict[str, Any]]) -> bytes:
    """Rows as a Parquet file, as a pipeline would write them to object storage."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    return buffer.getvalue()


def jsonl_bytes(rows: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def wait_until_up(answers: Any, process: Any, what: str, log_path: Path, timeout_s: float) -> None:
    """Until a server a test started answers (`answers()`): those that print no ready line to wait
    on are polled. Fails, naming its log, if the process exits or the time runs out first."""
    deadline = time.monotonic() + timeout_s
    while not answers():
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start (see {log_path})")
        time.sleep(0.2)


async def all_succeed(
    settings: Settings, requests: dict[str, dict[str, Any]], daemon: Any, timeout_s: float = 800
) -> dict[str, Any]:
    """Submit the requests to the started daemon, stop it once each has its terminal event, and
    return each request's `succeeded` (failing, with the events, unless every one succeeded)."""
    try:
        for request in requests.values():
            await submit(settings, request)
        events = await terminal_events(settings, set(requests), timeout_s=timeout_s)
    finally:
        daemon.stop()
    done = {request_id: request_events[-1] for request_id, request_events in events.items()}
    assert all(event.type == "succeeded" for event in done.values()), done
    return done


def fleet_key(folder: Path) -> Path:
    """A fleet's event-signing key (PEM) in `folder`, made once: what settings with a checkpoint store
    need (it signs what the fleet writes there, docs/guarantees.md)."""
    from schemas.signing import new_key_pair

    path = folder / "fleet-signing-key.pem"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        path.write_bytes(new_key_pair()[0])
    return path


def sft_request(request_id: str, **overrides: Any) -> dict[str, Any]:
    """A small SFT request on the published tiny model and chat dataset; 4 steps."""
    request: dict[str, Any] = {
        "schema_version": 1,
        "request_id": request_id,
        "method": "sft",
        "model": {"id": TINY_MODEL},
        "dataset": {"id": CHAT_DATASET},
        "peft": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        "training": {"max_steps": 4, "learning_rate": 1e-2, "per_device_train_batch_size": 2},
        "output": {"repo_id": f"results/{request_id}"},
        "metadata": {"team": "tests"},
    }
    request.update(overrides)
    return request


EXAMPLES_DIR = Path(schemas.__file__).parent / "examples"

SMALL_TRAINING = {"max_steps": 3, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
SMALL_LORA = {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0}


def example_request(method: str, request_id: str, **overrides: Any) -> dict[str, Any]:
    """The README's example for `method` (schemas/examples), pointed at the tiny model on the local Hub
    with a small LoRA and a few steps; its method block and rewards stay as written unless overridden."""
    request = json.loads((EXAMPLES_DIR / f"{method}.json").read_text())
    request.update(
        request_id=request_id,
        model={"id": TINY_MODEL},
        peft=SMALL_LORA,
        training=SMALL_TRAINING,
        output={**request["output"], "repo_id": f"results/{request_id}"},
    )
    request.update(overrides)
    return request


def run_handler(request: dict[str, Any], work: Path, **job: Any) -> tuple[Any, list[dict[str, Any]]]:
    """Run a request's handler in this process, as the child would, without a daemon or Kafka: the
    handler's TrainResult, or the JobFailed it raised, and every message it sent on its status pipe."""
    from handlers.methods import HANDLERS
    from handlers.protocol import JobFailed, JobSpec
    from handlers.toolkit.reporting import StatusReporter

    spec = JobSpec(
        request=request, checkpoints=work / "checkpoints", artifact=work / "artifact", progress_interval_s=0, **job
    )
    work.mkdir(parents=True, exist_ok=True)
    status = work / "status.jsonl"
    reporter = StatusReporter(os.open(status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC))
    outcome: Any
    try:
        outcome = HANDLERS[request["method"]].train(
            schemas.REQUEST_MODELS[request["method"]].model_validate(request), spec, reporter
        )
    except JobFailed as failure:
        outcome = failure
    finally:
        reporter._stream.close()
    return outcome, [json.loads(line) for line in status.read_text().splitlines()]


def other_model(tiny_model_dir: Path, out_dir: Path, **config: int) -> Path:
    """A causal LM other than the tiny base: the same architecture and tokenizer, other random weights
    (or, with `config`, another shape), to be a reference model."""
    from transformers import AutoTokenizer

    from handlers.fixtures.tiny_model import build_model

    model = build_model(AutoTokenizer.from_pretrained(tiny_model_dir), seed=1)
    if config:
        from transformers import Qwen2ForCausalLM

        model = Qwen2ForCausalLM(model.config.__class__(**{**model.config.to_dict(), **config}))
    model.save_pretrained(out_dir)
    return out_dir


def download(hub_endpoint: str, repo_id: str, revision: str | None, cache_dir: Path) -> Path:
    from huggingface_hub import snapshot_download

    return Path(
        snapshot_download(repo_id, revision=revision, endpoint=hub_endpoint, token=HUB_TOKEN, cache_dir=cache_dir)
    )


def assert_adapter_trained(adapter_dir: Path, base_dir: Path, *, sequence_classifier: bool = False) -> None:
    """The adapter loads with PEFT on the base; LoRA starts B at zero, so a non-zero B means it trained."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    loader = AutoModelForSequenceClassification if sequence_classifier else AutoModelForCausalLM
    kwargs = {"num_labels": 1} if sequence_classifier else {}
    model = PeftModel.from_pretrained(loader.from_pretrained(base_dir, **kwargs), adapter_dir)
    lora_b = [p for name, p in model.named_parameters() if "lora_B" in name]
    assert lora_b, "no LoRA weights in the pushed adapter"
    assert any(torch.count_nonzero(p) > 0 for p in lora_b), "LoRA B is still all zeros: nothing was trained"


def assert_full_model_trained(model_dir: Path, base_dir: Path, *, sequence_classifier: bool = False) -> None:
    """The pushed weights load with transformers alone and differ from the base's."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    loader = AutoModelForSequenceClassification if sequence_classifier else AutoModelForCausalLM
    trained = loader.from_pretrained(model_dir).state_dict()
    base = AutoModelForCausalLM.from_pretrained(base_dir).state_dict()
    base = {name.removeprefix("lm_head.").removeprefix("model."): tensor for name, tensor in base.items()}
    shared = [name for name in trained if name.removeprefix("model.") in base]
    assert shared, "no weights in common with the base model"
    assert any(not torch.equal(trained[name], base[name.removeprefix("model.")]) for name in shared)


def ids_on_partitions(prefix: str, partitions: int) -> list[str]:
    """One request id per partition: Kafka places a keyed message by the murmur2 hash of its key."""
    partitioner = DefaultPartitioner()
    found: dict[int, str] = {}
    for n in range(1000):
        candidate = f"{prefix}-{n}"
        found.setdefault(partitioner(candidate.encode(), list(range(partitions)), list(range(partitions))), candidate)
        if len(found) == partitions:
            return [found[p] for p in range(partitions)]
    raise AssertionError("no ids found")


# The convert ledger's lines for keys that went where the file meant (carried, at TRL's default,
# read): most convert tests look at the rest, what changed or was left out.
ACCOUNTED = re.compile(r"^[\w.]+: (carried to |left at TRL's default |read: it decides)")


def said(stderr: str) -> list[str]:
    """The lines of `adapterd convert`'s ledger that say a key changed meaning or was left out."""
    return [line for line in stderr.splitlines() if not ACCOUNTED.match(line)]


@functools.cache
def _event_examples() -> dict[str, str]:
    """docs/events.md's example of each event type, as JSON text, read once."""
    examples = re.findall(
        r"```json\n(.*?)\n```", (Path(__file__).parents[1] / "docs" / "events.md").read_text(), re.DOTALL
    )
    return {json.loads(text)["type"]: text for text in examples}


def local_success(request_id: str, **fields: Any) -> schemas.Succeeded:
    """A `succeeded` event of an SFT job pushed to the local sink, every required field given; `fields` override them.
    The tests that fold successes (durations, metrics, the table, the view) vary only a few of its fields."""
    required: dict[str, Any] = {
        "sink": "local",
        "repo_id": "a/b",
        "revision": "main",
        "commit_sha": None,
        "commit_url": None,
        "location": "/x",
        "files": [],
        "metrics": {},
        "durations_s": {},
        "versions": {},
        "method": "sft",
        "trainer": "SFTTrainer",
        "base_model": "tiny",
        "base_model_revision": None,
        "dataset_fingerprint": None,
    }
    return schemas.Succeeded(request_id=request_id, **{**required, **fields})


def event_document(kind: str, **fields: Any) -> dict[str, Any]:
    """An event of `kind` as docs/events.md's example shows it, with `fields` replaced or added."""
    return {**json.loads(_event_examples()[kind]), **fields}


# What starts a fuzzer (libFuzzer through atheris) from a test: a small Python process that runs it as its own
# child. Linux carries a process's peak resident size across exec, so a fuzzer exec'd straight from a pytest worker
# starts with the worker's peak (2 GB and more once the worker has loaded torch) and libFuzzer's `-rss_limit_mb`
# (2 GB) calls that out of memory before any input is to blame (CI, 2026-12-06). Forked from this small process,
# the fuzzer's peak is its own, which is what the limit is there to bound.
FUZZER_PARENT = [sys.executable, "-c", "import subprocess, sys; sys.exit(subprocess.run(sys.argv[1:]).returncode)"]


@contextlib.contextmanager
def status_config(document: dict[str, Any], folder: Path) -> Iterator[Path]:
    """A daemon's /status serving `document` (as it is when asked) on the loopback, and a settings file in `folder`
    whose metrics_address names it: what `adapterd status -c FILE` reads."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Status(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(document).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass  # not on the command's output

    server = ThreadingHTTPServer(("127.0.0.1", 0), Status)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()
    config = folder / "host.toml"
    config.write_text(f'metrics_address = "127.0.0.1:{server.server_address[1]}"\n')
    try:
        yield config
    finally:
        server.shutdown()
