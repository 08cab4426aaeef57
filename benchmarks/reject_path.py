"""The rejection path at intake, in process: microseconds a rejected message for `Intake.take` on a
batch of bad records (decode, refusal, the `rejected` event and DLQ record, and `send_all`'s
partition choice and batching), as median [min, max] over a few rounds. No broker, no daemon.

The publisher is the real one with a real (never started) aiokafka producer: its batches are
built as they are in the daemon; only `partitions_for` and `send_batch`, which would need a
broker, are stand-ins. Logging is configured as the intake benchmark runs the daemon
(level error), so the warning per rejection is filtered, not written; the heap built so far is
frozen where the daemon freezes its start-up heap (daemon/ops/heap.py), so that the full
collections the rejections bring walk what the daemon's would.

`python benchmarks/reject_path.py` measures the checkout on the path. To compare two checkouts in
one run, each round alternating which goes first:
`python benchmarks/reject_path.py --checkout /work/main --checkout /work/wt-intake`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PARTITIONS = 6  # of the events topic and the DLQ, as the stand-in reports them


def refused_message(index: int) -> bytes:
    """A valid request this host refuses (more GPUs than it has): the path through
    `daemon.admission.judge.refusal`, in intake's thread."""
    return json.dumps(
        {
            "schema_version": 1,
            "request_id": f"big-{index}",
            "method": "sft",
            "model": {"id": "x/y"},
            "dataset": {"rows": [{"text": "t"}]},
            "output": {"repo_id": "a/b"},
            "resources": {"gpus": 64},
        }
    ).encode()


def records(mix: str, count: int) -> list:
    from aiokafka.structs import ConsumerRecord

    from benchmarks.intake import bad_message

    # Keyed by request id, as producers key requests: a DLQ record and its event share the key.
    make, prefix = (bad_message, "bad") if mix == "bad mix" else (refused_message, "big")
    return [
        ConsumerRecord(
            "adapterd.requests", 0, offset, 0, 0, f"{prefix}-{offset}".encode(), make(offset), None, 0, 0, []
        )
        for offset in range(count)
    ]


async def microseconds(mix: str, count: int) -> float:
    """One round: µs a message for `Intake.take` over `count` records of `mix`, after a warm-up batch."""
    from aiokafka import TopicPartition

    from daemon.intake import Intake
    from daemon.kafka.publisher import Publisher
    from daemon.ops.logs import configure_logging
    from daemon.resources.slots import Slots
    from daemon.settings import Settings

    configure_logging("json", "error")
    # A work folder of its own: the publisher keeps this host's retry key there.
    settings = Settings(gpus=[], warm_child=False, work_dir=Path(tempfile.mkdtemp(prefix="adapterd-reject-path-")))
    publisher = Publisher(settings)
    acked = asyncio.get_running_loop().create_future()
    acked.set_result(None)

    async def partitions_for(topic: str) -> set[int]:
        return set(range(PARTITIONS))

    async def send_batch(batch: object, topic: str, partition: int) -> asyncio.Future[None]:
        return acked

    publisher.producer.partitions_for = partitions_for  # type: ignore[method-assign]
    publisher.producer.send_batch = send_batch  # type: ignore[method-assign]
    intake = Intake(settings, publisher, Partitions(), Scheduler(), Slots([], 1))  # type: ignore[arg-type]
    tp = TopicPartition("adapterd.requests", 0)
    batch = 500  # records handed to take at once, as a fetch would
    freeze_startup_heap()  # before the records: a fetch's records are made after the daemon's start
    warm, timed = records(mix, batch), records(mix, count)
    await intake.take(tp, warm)
    started = time.perf_counter()
    for start in range(0, count, batch):
        await intake.take(tp, timed[start : start + batch])
    elapsed = time.perf_counter() - started
    await publisher.stop()
    return elapsed / count * 1e6


def freeze_startup_heap() -> None:
    """What the daemon does before its first poll, where it does (daemon/ops/heap.py): a checkout
    from before it measures its collections over the whole heap, as its daemon ran."""
    try:
        from daemon.ops.heap import freeze_startup_heap as freeze
    except ImportError:
        return
    freeze()


class Partitions:
    """Stand-in: nothing to settle without a broker; the one partition stays this member's."""

    def settle_later(self, tp: object, acks: object, offset: int) -> None:
        pass

    def assigned(self) -> set[object]:
        from aiokafka import TopicPartition

        return {TopicPartition("adapterd.requests", 0)}


class Scheduler:
    """Stand-in: no partition is held, so take reads every record."""

    def holds(self, tp: object) -> bool:
        return False


MIXES = ("bad mix", "refused")


def one_round(count: int) -> dict[str, float]:
    return {mix: asyncio.run(microseconds(mix, count)) for mix in MIXES}


def summary(runs: list[float]) -> str:
    return f"{statistics.median(runs):6.2f} [{min(runs):.2f}, {max(runs):.2f}]"


def compare(checkouts: list[str], rounds: int, count: int) -> None:
    """Rounds in fresh interpreters, one checkout first on the path each; the order turns each round."""
    runs: dict[str, dict[str, list[float]]] = {c: {mix: [] for mix in MIXES} for c in checkouts}
    for index in range(rounds):
        for checkout in checkouts[index % len(checkouts) :] + checkouts[: index % len(checkouts)]:
            env = {**os.environ, "PYTHONPATH": checkout}
            out = subprocess.run(
                [sys.executable, __file__, "--one-round", "--messages", str(count)],
                env=env,
                cwd=checkout,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for mix, value in json.loads(out).items():
                runs[checkout][mix].append(value)
    print(f"us per rejected message, median [min, max] of {rounds} rounds x {count} messages")
    print(f"{'checkout':30s} " + " ".join(f"{mix:>24s}" for mix in MIXES))
    for checkout in checkouts:
        print(f"{checkout:30s} " + " ".join(f"{summary(runs[checkout][mix]):>24s}" for mix in MIXES))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkout", action="append", default=[], help="a checkout to measure (repeat to compare)")
    parser.add_argument("--one-round", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_round:
        print(json.dumps(one_round(args.messages)))
    else:
        compare(args.checkout or [os.getcwd()], args.rounds, args.messages)


if __name__ == "__main__":
    main()
