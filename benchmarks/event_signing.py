"""Signed events, in process: events per second signed and verified (Ed25519, schemas/signing.py), and
what signing adds to publishing one (`Publisher.event_message`) and verifying to reading one
(`EventStream.verified`: verify, then parse), each for a small `rejected` and a large `succeeded`,
as median [min, max] over a few runs. No broker, no daemon.

    uv run python -m benchmarks.event_signing [--events 5000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory

from daemon.kafka.event_reader import EventStream
from daemon.kafka.publisher import Publisher
from daemon.settings import Settings
from schemas import FieldError, Rejected, Succeeded, parse_event
from schemas.signing import SIGNATURE_HEADER, EventKeys, EventSigner, new_key_pair, read_private_key
from testbed.memory_kafka import FakeProducer, FakeRecord


def _succeeded() -> Succeeded:
    """A `succeeded` of the size the fleet publishes: metrics, durations, versions, sources."""
    return Succeeded(
        request_id="bench-1",
        sink="hub",
        repo_id="team/adapter",
        revision="main",
        commit_sha="0" * 40,
        commit_url="https://huggingface.co/team/adapter/commit/" + "0" * 40,
        location="https://huggingface.co/team/adapter",
        files=["adapter_config.json", "adapter_model.safetensors", "README.md"],
        metrics={f"metric_{i}": i / 7 for i in range(20)},
        durations_s={f"stage_{i}": i * 1.5 for i in range(16)},
        versions={name: "1.0.0" for name in ("adapterd", "trl", "transformers", "peft", "torch", "datasets")},
        method="sft",
        trainer="SFTTrainer/SFTConfig",
        base_model="Qwen/Qwen2.5-0.5B",
        base_model_revision="1" * 40,
        dataset_fingerprint="f" * 16,
    )


def _cases(
    event: Rejected | Succeeded,
    value: bytes,
    signer: EventSigner,
    keys: EventKeys,
    publishers: dict[str, Publisher],
    stream: EventStream,
    unverified: EventStream,
) -> dict[str, Callable[[], object]]:
    """What is timed, for one event: each a call made `--events` times."""
    record = FakeRecord("adapterd.events", 0, 0, b"bench-1", value, [(SIGNATURE_HEADER, signer.sign(value))])
    return {
        "sign": lambda: signer.sign(value),
        "verify": lambda: keys.verify(value, record.headers),
        "publish (event_message), signed": lambda: publishers["signed"].event_message(event),
        "publish (event_message), unsigned": lambda: publishers["unsigned"].event_message(event),
        # After its first call each read is a repeat (the same event_id): verified and parsed
        # all the same, then dropped by id.
        "read (verify + parse), verified": lambda: stream.verified(record),
        "read (parse alone), unverified": lambda: unverified.verified(record),
        "parse_event alone": lambda: parse_event(value),
    }


def per_second(work: Callable[[], object], count: int) -> float:
    started = time.perf_counter()
    for _ in range(count):
        work()
    return count / (time.perf_counter() - started)


def figure(name: str, runs: list[float]) -> str:
    return f"{name:38s} {statistics.median(runs):>10,.0f} events/s [{min(runs):,.0f}, {max(runs):,.0f}]"


async def main() -> None:
    """Async only because the event stream's Kafka consumer is made on a running loop; nothing is awaited."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    pem, public = new_key_pair()
    signer, keys = EventSigner(read_private_key(pem)), EventKeys.parse([public])
    rejected = Rejected(
        request_id="bench-1", reason="invalid", errors=[FieldError(path="training.max_steps", message="not an integer")]
    )
    with TemporaryDirectory() as folder:
        (Path(folder) / "key.pem").write_bytes(pem)
        signing = Settings(gpus=[], warm_child=False, event_signing_key_file=Path(folder) / "key.pem")
        plain = Settings(gpus=[], warm_child=False)
        stream, unverified = EventStream(signing), EventStream(plain)
        publishers = {"signed": Publisher(signing, FakeProducer({})), "unsigned": Publisher(plain, FakeProducer({}))}
    for event in (rejected, _succeeded()):
        value = event.model_dump_json().encode()
        print(f"{event.type}: {len(value)} bytes")
        cases = _cases(event, value, signer, keys, publishers, stream, unverified)
        for name, work in cases.items():
            print("  " + figure(name, [per_second(work, args.events) for _ in range(args.runs)]))
    for one in (stream, unverified):
        await one.reader.stop()  # never started: this only closes its client


if __name__ == "__main__":
    asyncio.run(main())
