"""Helpers the tests share: publishing requests and reading events, offsets and dead letters back
from the real broker, and a small valid request to start from."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord
from pydantic import SecretStr

import schemas
from daemon.kafka_options import kafka_options
from daemon.settings import Settings
from daemon.topic_reader import TopicReader
from schemas import TERMINAL_TYPES, Event, parse_event

HUB_TOKEN = "hf_adapterd_test_token"
TINY_MODEL = "tiny/qwen2-chat"
CHAT_DATASET = "tiny/chat-rows"
PREFERENCE_DATASET = "tiny/preferences"
EVENT_TIMEOUT_S = 240.0

CHAT_ROWS = [
    {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    for q, a in [
        ("What is the capital of France?", "The capital of France is Paris."),
        ("What is two plus two?", "Two plus two equals four."),
        ("Where are the requests kept?", "Kafka keeps the requests."),
        ("Where are the adapters kept?", "The Hub keeps the adapters."),
        ("What is three plus five?", "Three plus five equals eight."),
        ("Is the dog lazy?", "yes, the dog is lazy."),
    ]
]


async def produce(settings: Settings, value: bytes, key: bytes | None = None, topic: str | None = None) -> int:
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        meta = await producer.send_and_wait(topic or settings.requests_topic, value, key=key)
    finally:
        await producer.stop()
    return int(meta.offset)


async def submit(settings: Settings, request: dict[str, Any]) -> int:
    return await produce(settings, json.dumps(request).encode(), request["request_id"].encode())


async def read_records(settings: Settings, topic: str, count: int, timeout_s: float = EVENT_TIMEOUT_S) -> list[ConsumerRecord[bytes, bytes]]:
    """The first `count` records of a topic (in partition order); fails if they do not arrive in time."""
    records: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(timeout_s), TopicReader(settings, topic) as reader:
        async for record in reader.records():
            records.append(record)
            if len(records) == count:
                break
    return records


async def terminal_events(settings: Settings, request_ids: set[str | None], timeout_s: float = EVENT_TIMEOUT_S) -> dict[str | None, list[Event]]:
    """Every event of the given requests, up to and including each one's terminal event."""
    events: dict[str | None, list[Event]] = {rid: [] for rid in request_ids}
    waiting = set(request_ids)
    async with asyncio.timeout(timeout_s), TopicReader(settings, settings.events_topic) as reader:
        async for record in reader.records():
            event = parse_event(record.value or b"")
            if event.request_id in events:
                events[event.request_id].append(event)
                if event.type in TERMINAL_TYPES:
                    waiting.discard(event.request_id)
            if not waiting:
                break
    return events


async def committed_offset(settings: Settings, partition: int = 0) -> int | None:
    consumer = AIOKafkaConsumer(**kafka_options(settings), group_id=settings.group_id, enable_auto_commit=False)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(settings.requests_topic, partition))
    finally:
        await consumer.stop()


async def wait_for_commit(settings: Settings, offset: int, partition: int = 0, timeout_s: float = 30) -> None:
    """Until the group's committed offset reaches `offset`. The daemon commits just after a terminal
    event is acknowledged, and Kafka offers no notification of a commit, so this polls."""
    async with asyncio.timeout(timeout_s):
        while (await committed_offset(settings, partition) or 0) < offset:
            await asyncio.sleep(0.2)
    assert await committed_offset(settings, partition) == offset


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

PREFERENCE_ROWS = [
    {"prompt": "What is two plus two?", "chosen": "Two plus two equals four.", "rejected": "yes no yes no"},
    {"prompt": "Where are the requests kept?", "chosen": "Kafka keeps the requests.", "rejected": "the dog is lazy"},
    {"prompt": "What is the capital of France?", "chosen": "The capital of France is Paris.", "rejected": "eight"},
    {"prompt": "Where are the adapters kept?", "chosen": "The Hub keeps the adapters.", "rejected": "no"},
]
PROMPT_ROWS = [
    {"prompt": "Two plus two equals", "answer": "four"},
    {"prompt": "Three plus five equals", "answer": "eight"},
    {"prompt": "The capital of France is", "answer": "Paris"},
    {"prompt": "Kafka keeps the", "answer": "requests"},
]
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


async def run_to_end(settings: Settings, request: dict[str, Any]) -> list[Event]:
    await submit(settings, request)
    return (await terminal_events(settings, {request["request_id"]}))[request["request_id"]]


def download(hub_endpoint: str, repo_id: str, revision: str | None, cache_dir: Path) -> Path:
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(repo_id, revision=revision, endpoint=hub_endpoint, token=HUB_TOKEN, cache_dir=cache_dir))


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


def write_config(settings: Settings, path: Path) -> Path:
    """The settings as a TOML file an operator would write; the Hub token stays out of it."""
    lines = []
    for name, value in settings.model_dump(mode="json", exclude={"hub_token", "sasl_password"}).items():
        if value is not None:
            lines.append(f"{name} = {json.dumps(value)}")  # JSON strings, numbers, booleans and lists are TOML too
    path.write_text("\n".join(lines) + "\n")
    return path


def unit_daemon(settings: Settings, directory: Path, extra_env: dict[str, str] | None = None) -> DaemonProcess:
    """The daemon as deploy/adapterd.service starts it: its ExecStart command line and its Environment=
    lines, with the config file, the credentials directory (LoadCredential=) and the state directory
    moved under `directory`, and the program taken from this checkout's virtual environment."""
    unit = (Path(__file__).parents[1] / "deploy" / "adapterd.service").read_text()
    config = write_config(settings, directory / "adapterd.toml")
    credentials = directory / "credentials"
    credentials.mkdir(exist_ok=True)
    assert settings.hub_token is not None
    (credentials / "hub-token").write_text(settings.hub_token.get_secret_value() + "\n")

    def place(value: str) -> str:
        return (
            value.replace("/opt/adapterd/.venv/bin", str(Path(sys.executable).parent))
            .replace("/etc/adapterd/adapterd.toml", str(config))
            .replace("/var/lib/adapterd", str(directory / "state"))
            .replace("%d", str(credentials))
        )

    environment = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")}
    command: list[str] = []
    for line in unit.splitlines():
        key, _, value = line.partition("=")
        if key == "Environment":
            name, _, setting = value.partition("=")
            environment[name] = place(setting)
        elif key == "ExecStart":
            command = shlex.split(place(value))
    return DaemonProcess(settings, directory / "daemon.log", extra_env=extra_env or {}, command=command, environment=environment)


def settings_environment(settings: Settings) -> dict[str, str]:
    """The environment that makes `adapterd run` use `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")}
    for name, value in settings.model_dump(mode="json").items():
        if value is None:
            continue
        secret = getattr(settings, name)
        if isinstance(secret, SecretStr):
            if getattr(settings, f"{name}_file", None) is not None:
                continue  # the daemon reads it from the file, as under systemd
            value = secret.get_secret_value()
        env[f"ADAPTERD_{name.upper()}"] = json.dumps(value) if isinstance(value, list) else str(value)
    env["HF_HOME"] = str(settings.work_dir / "hf-home")
    return env


@dataclass
class DaemonProcess:
    """`adapterd run` as an operator starts it, in a child process of the test."""

    settings: Settings
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # Instead of `python -m daemon.cli run` with the settings in ADAPTERD_* variables: a command
    # line and an environment of its own (the systemd unit's, see `unit_daemon`).
    command: list[str] | None = None
    environment: dict[str, str] | None = None

    def start(self) -> DaemonProcess:
        self.settings.work_dir.mkdir(parents=True, exist_ok=True)
        environment = settings_environment(self.settings) if self.environment is None else self.environment
        self.process = subprocess.Popen(
            self.command or [sys.executable, "-m", "daemon.cli", "run"],
            env={**environment, **self.extra_env},
            stdout=subprocess.DEVNULL, stderr=self.log_path.open("ab"),
        )
        return self

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"event": "raw", "text": line})
        return lines


class NotifySocket:
    """A real sd_notify socket, as systemd binds it for a `Type=notify` unit; it collects what the daemon says."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.lines: list[str] = []

    def environment(self, watchdog_usec: int | None = None) -> dict[str, str]:
        env = {"NOTIFY_SOCKET": str(self.path)}
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        return env

    async def wait_for(self, prefix: str, timeout_s: float = EVENT_TIMEOUT_S) -> str:
        """The first line starting with `prefix` that arrives from now on."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while True:
                datagram = await loop.sock_recv(self.sock, 65536)
                lines = datagram.decode().splitlines()
                self.lines += lines
                for line in lines:
                    if line.startswith(prefix):
                        return line

    def close(self) -> None:
        self.sock.close()


def http_get(address: str, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def metric(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from a Prometheus text exposition, or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def submit_and_follow(settings: Settings, request: dict[str, Any], timeout_s: float = EVENT_TIMEOUT_S) -> list[Event]:
    """Submit a request and return its events up to its terminal one, reading from the end of the
    events topic as it was before the submission: an earlier request with the same id is not seen."""
    from daemon.event_reader import EventStream

    async with asyncio.timeout(timeout_s), EventStream(settings, from_end=True) as stream:
        await submit(settings, request)
        return [event async for event in stream.events(request["request_id"])]


async def wait_until_gone(pid: int, timeout_s: float = 30) -> None:
    """Until the process no longer runs (gone, or a zombie waiting for init to reap it). The kernel
    gives no event to await for another process's death, so this polls /proc."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                return
            if state in ("Z", "X"):
                return
            await asyncio.sleep(0.1)


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
