"""The whole intake decision over issue 37's adversarial records, beside benign ones of the same size,
and the event loop's longest pause while it runs.

`benchmarks.adversarial` times decoding and the secret scan over hostile text; this one times what
intake does with a record from its bytes to its decision (decode with duplicate-key detection and
strict types, the operator's policy and Hub id rules, the pattern checks, the inline images'
headers, in their worker thread), on the event loop as the daemon runs it, with a task beside it
that measures how long the loop goes without a turn. Per size (up to the broker's 1 MiB):
milliseconds per decision (median of `--repeats`, five rounds alternating adversarial and benign),
the median ratio adversarial / benign of the rounds and its spread (lowest-highest), and the longest
loop pause. Target (issue 37): no ratio above 5, no pause above 100 ms. A row in parentheses is a
benign request with ordinary inline images: not a target, the cost of images as such.
In process, no broker: `uv run python -m benchmarks.record_intake`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import random
import statistics
import string
import time
from collections.abc import Callable
from pathlib import Path

from PIL import Image

from daemon import decoding
from daemon.cli.demo.requests import VISION_CHAT_ROWS
from daemon.intake import judged
from daemon.resources.slots import Slots
from daemon.settings import Settings
from schemas import Rejection
from testbed.memory_kafka import FakeRecord

HOST = Settings(work_dir=Path("/nonexistent/adapterd-bench"), allowed_local_model_roots=[Path("/models")])
SLOTS = Slots([], 1)
BASE = {
    "schema_version": 1,
    "request_id": "bench-1",
    "method": "sft",
    "model": {"id": "org/base"},
    "output": {"repo_id": "org/adapter"},
}


def _webp_bomb() -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (4096, 4096), (10, 20, 30)).save(buffer, "WEBP", lossless=True)  # 0.2 s to decode
    return "data:image/webp;base64," + base64.b64encode(buffer.getvalue()).decode()


BOMB = _webp_bomb()


def _photo() -> str:
    buffer = io.BytesIO()
    Image.effect_noise((64, 64), 40).convert("RGB").save(buffer, "PNG")  # an ordinary small image, noisy as a photo is
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


PHOTO = _photo()


def _raw(document: dict[str, object]) -> bytes:
    return json.dumps(document).encode()


_RANDOM = random.Random(0)
LETTERS = "".join(
    _RANDOM.choice(string.ascii_letters + string.digits) for _ in range(2_000_000)
)  # as random as a key or an image's base64
# A letter that begins a rule counting its class (detect-secrets' Discord token, `[MNO][a-zA-Z\d_-]{23,25}\.`), and
# 'a.' the URL rule's scheme, each every few random letters: every one begins the rule again.
SPRINKLED = {
    lead: "".join(lead + LETTERS[i : i + _RANDOM.randint(0, 20)] for i in range(0, 60_000, 20)) for lead in ("M", "a.")
}


def _rows_of(text: str, n: int) -> bytes:
    """Text rows of about `n` bytes cut from `text`, each with a newline escape (so the scan walks every string)."""
    return _raw(
        {**BASE, "dataset": {"rows": [{"text": text[i : i + 1000] + "\n"} for i in range(0, max(1000, n - 300), 1000)]}}
    )


# name → a record of about n bytes aimed at one weakness of the whole decision.
SHAPES: dict[str, Callable[[int], bytes]] = {
    "duplicate keys": lambda n: _raw({**BASE, "dataset": {"rows": [{"text": "a"}]}}).replace(
        b'"rows"', b'"x": 1, ' * (n // 8) + b'"rows"', 1
    ),
    "4096x4096 WebP images inline": lambda n: _raw(
        {**BASE, "dataset": {"rows": [{**VISION_CHAT_ROWS[0], "images": [BOMB]}] * (n // (len(BOMB) + 200))}}
    ),
    "LoRA pattern keys": lambda n: _raw(
        {
            **BASE,
            "dataset": {"rows": [{"text": "a"}]},
            "peft": {"rank_pattern": {f"(x{i}|[a-z._0-9]+)+q_proj": 4 for i in range(n // 40)}},
        }
    ),
    "strings where numbers go": lambda n: _raw(
        {**BASE, "dataset": {"rows": [{"text": "a"}]}, "training": {"max_steps": "9" * n}}
    ),
    "Hub ids the Hub refuses": lambda n: _raw(
        {
            **BASE,
            "dataset": {"mixture": [{"id": f"a--b{i}/x.git"} for i in range(min(64, n // 30))], "columns": {}},
            "metadata": {"p": "a" * max(0, n - 64 * 30)},
        }
    ),
    "random letters in rows": lambda n: _rows_of(LETTERS, n),
    "a rule's first letter sprinkled": lambda n: _rows_of(SPRINKLED["M"] * (n // len(SPRINKLED["M"]) + 1), n),
    "a URL's scheme sprinkled": lambda n: _rows_of(SPRINKLED["a."] * (n // len(SPRINKLED["a."]) + 1), n),
    "NUL paths": lambda n: _raw(
        {**BASE, "model": {"id": "/models/" + "\u0000" * (n // 6)}, "dataset": {"rows": [{"text": "a"}]}}
    ),
}

# Not adversarial: what a benign request with inline images costs beside text rows, to read the
# images row against (its ratio is the cost of images as such).
REFERENCES: dict[str, Callable[[int], bytes]] = {
    "ordinary 64x64 PNG images inline": lambda n: _raw(
        {**BASE, "dataset": {"rows": [{**VISION_CHAT_ROWS[0], "images": [PHOTO]}] * max(1, n // (len(PHOTO) + 200))}}
    ),
}


def benign(size: int) -> bytes:
    """A valid request of about `size` bytes: plain text in its rows."""
    document = {**BASE, "dataset": {"rows": [{"text": "lorem ipsum " * 20}] * max(1, size // 260)}}
    return _raw(document)


async def decide(raw: bytes) -> object:
    """Intake's decision about one record, as `Intake.take` makes it."""
    decoded = await decoding.decoded(FakeRecord("bench", 0, 0, b"bench-1", raw), HOST.max_message_bytes)
    return decoded if isinstance(decoded, Rejection) else await judged(decoded, HOST, SLOTS)


async def milliseconds(raw: bytes, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await decide(raw)
        times.append((time.perf_counter() - started) * 1e3)
        await asyncio.sleep(0)  # the ticker's turn: it measures how long this decision held the loop
    return statistics.median(times)


async def run(sizes: list[int], repeats: int) -> None:
    pauses: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:  # the loop's other work (heartbeats, acknowledgements): how long it waits
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            pauses.append(now - last - 0.001)
            last = now

    ticking = asyncio.create_task(ticker())
    worst: tuple[float, str] = (0.0, "")
    print(
        f"{'shape':34s} {'bytes':>9s} {'adversarial ms':>15s} {'benign ms':>10s} {'ratio':>6s} "
        f"{'spread':>12s} {'loop pause ms':>14s}"
    )
    for size in sizes:
        for name, shape in {**SHAPES, **REFERENCES}.items():
            hostile = shape(size)
            good = benign(len(hostile))
            pauses.clear()
            bad_ms, good_ms = [], []
            for _ in range(5):  # alternated, so a slow phase of the host falls on both
                bad_ms.append(await milliseconds(hostile, repeats))
                good_ms.append(await milliseconds(good, repeats))
            ratios = [bad / good for bad, good in zip(bad_ms, good_ms, strict=True)]  # each pair measured side by side
            ratio = statistics.median(ratios)
            pause = max(pauses, default=0.0) * 1e3
            label = name if name in SHAPES else f"({name})"
            row = (
                f"{label:34s} {len(hostile):9d} {statistics.median(bad_ms):15.2f} {statistics.median(good_ms):10.2f} "
                f"{ratio:6.2f} {f'{min(ratios):.2f}-{max(ratios):.2f}':>12s} {pause:14.1f}"
            )
            print(row, flush=True)
            if name in SHAPES:
                worst = max(worst, (ratio, row))
    done.set()
    await ticking
    print(f"worst ratio: {worst[0]:.2f} ({worst[1].split('  ')[0].strip()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[4_096, 65_536, 262_144, 1_000_000])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(run(args.sizes, args.repeats))


if __name__ == "__main__":
    main()
