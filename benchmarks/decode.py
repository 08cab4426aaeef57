"""Decoding alone, in process: microseconds a message for intake's bad-message mix and for a valid
SFT request, each as median [min, max] over a few runs. No broker, no daemon.

`python -m benchmarks.decode` measures the checkout it is run from (`-m` puts the working directory
first on the path, ahead of PYTHONPATH); to compare two, alternate runs from each checkout's own
folder, or use `benchmarks/reject_path.py --checkout A --checkout B`, which does that for intake.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from benchmarks.intake import bad_message
from schemas import decode_request

VALID = json.dumps(
    {
        "schema_version": 1,
        "request_id": "ok-1",
        "method": "sft",
        "model": {"id": "x/y"},
        "dataset": {"rows": [{"text": "t"}]},
        "output": {"repo_id": "a/b"},
    }
).encode()


def microseconds(messages: list[bytes]) -> float:
    started = time.perf_counter()
    for message in messages:
        decode_request(message, b"k-1")
    return (time.perf_counter() - started) / len(messages) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for name, messages in (
        ("bad mix", [bad_message(i) for i in range(args.messages)]),
        ("valid sft", [VALID] * args.messages),
    ):
        runs = [microseconds(messages) for _ in range(args.runs)]
        print(
            f"{name:10s} {statistics.median(runs):6.2f} us/message [{min(runs):.2f}, "
            f"{max(runs):.2f}] over {args.runs} runs"
        )


if __name__ == "__main__":
    main()
