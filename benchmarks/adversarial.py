"""The worst decision time over an adversarial corpus, beside a benign message of the same size.

Intake decides about every record on the daemon's event loop (decode, the secret scan, the
operator's refusals), so the cost of one message must be bounded by its size, not by its shape.
Each adversarial message below aims at one place a pattern or a walk could go super-linear; its
benign twin is the same request with plain text of the same length. Per size (up to the broker's
1 MiB): milliseconds to decide each, median of `--repeats`, and the ratio adversarial / benign.
Target: no ratio above a few (the issue's "a few times a benign one"); the row with the worst
ratio is printed last. In process, no broker: `uv run python -m benchmarks.adversarial`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from daemon.admission.judge import refusal
from daemon.admission.secret_rules import SCANNER
from daemon.resources.slots import Slots
from daemon.settings import Settings
from schemas import Rejection, decode_request

HOST = Settings(
    work_dir=Path("/nonexistent/adapterd-bench"),
    allowed_local_dataset_roots=[Path("/data")],
    allowed_dataset_urls=["s3://bucket/*"],
)
SLOTS = Slots([], 1)

# name → text of about n characters aimed at one weakness.
SHAPES: dict[str, Callable[[int], str]] = {
    "scheme-like run then ':/'": lambda n: "a-" * (n // 2) + "x:/",
    "many '://' without userinfo": lambda n: "a://b" * (n // 5),
    "userinfo without '@'": lambda n: ("s://" + "u" * 250 + ":" + "p" * 250 + " ") * (n // 506),
    "repeated token prefixes": lambda n: "hf_sk-xoxb-eyJAIzaglpat-" * (n // 24),
    "bearer then spaces": lambda n: "Bearer" + " " * n,
    "base64-alphabet run": lambda n: "Ab9+" * (n // 4),
    "escaped surrogates": lambda n: "\ud800" * (n // 6),
    "long digits in text": lambda n: "9" * n,
}


def message(text: str, rows: int = 1) -> bytes:
    document = {
        "schema_version": 1,
        "request_id": "bench-1",
        "method": "sft",
        "model": {"id": "org/base"},
        "dataset": {"rows": [{"text": text}] * rows},
        "output": {"repo_id": "org/adapter"},
    }
    return json.dumps(document).encode("utf-8", errors="surrogatepass")


def decide(raw: bytes) -> object:
    decoded = decode_request(raw, b"bench-1", scanner=SCANNER)  # as intake decodes: with detect-secrets' rules too
    return decoded if isinstance(decoded, Rejection) else refusal(decoded, HOST, SLOTS)


def milliseconds(raw: bytes, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        decide(raw)
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_096, 65_536, 262_144, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    worst: tuple[float, str] = (0.0, "")
    print(f"{'shape':32s} {'bytes':>9s} {'adversarial ms':>15s} {'benign ms':>10s} {'ratio':>6s}")
    for size in args.sizes:
        for name, shape in SHAPES.items():
            hostile = message(shape(size))
            benign = message("lorem ipsum " * (len(hostile) // 12))
            # Side by side, alternated, so a slow phase of the host falls on both.
            bad, good = [], []
            for _ in range(3):
                bad.append(milliseconds(hostile, args.repeats))
                good.append(milliseconds(benign, args.repeats))
            ratio = statistics.median(bad) / statistics.median(good)
            row = (
                f"{name:32s} {len(hostile):9d} {statistics.median(bad):15.2f} "
                f"{statistics.median(good):10.2f} {ratio:6.2f}"
            )
            print(row, flush=True)
            worst = max(worst, (ratio, row))
    print(f"worst ratio: {worst[0]:.2f} ({worst[1].split('  ')[0].strip()})")


if __name__ == "__main__":
    main()
