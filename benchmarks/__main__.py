"""`python -m benchmarks`: every benchmark, side by side in one run on this machine.

Prints a table and writes it to benchmarks/results/latest.json (this run's rows) and latest.md
(each benchmark's latest table: this run rewrites only the sections of the benchmarks it ran,
benchmarks/latest.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import footprint, intake, latest, overhead, queue_start, start_latency
from benchmarks.harness import Environment, Row, markdown

RESULTS = Path(__file__).with_name("results")


async def main(args: argparse.Namespace) -> None:
    env = Environment.start()
    by_section: dict[str, list[Row]] = {}
    started = time.monotonic()
    try:
        if "intake" in args.only:
            by_section["intake"] = await intake.run(env, args.intake_messages)
        if "footprint" in args.only:
            by_section["footprint"] = await footprint.run(env)
        if "start" in args.only:
            by_section["start"] = await start_latency.run(env, args.repeats)
        if "queue" in args.only:
            by_section["queue"] = await queue_start.run(env, args.queue_jobs)
        if "overhead" in args.only:
            by_section["overhead"] = await overhead.run(
                env, args.overhead_steps, args.overhead_pairs, args.overhead_target
            )
    finally:
        env.stop()
    header = (
        f"adapterd benchmarks, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
        f"{time.monotonic() - started:.0f} s"
    )
    rows = [row for section in by_section.values() for row in section]
    print(markdown(rows, header))
    args.results.mkdir(parents=True, exist_ok=True)
    md = args.results / "latest.md"
    previous = md.read_text() if md.exists() else ""
    md.write_text(latest.updated(previous, {name: markdown(section, header) for name, section in by_section.items()}))
    (args.results / "latest.json").write_text(
        json.dumps({"header": header, "rows": [asdict(r) for r in rows]}, indent=2) + "\n"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=["intake", "footprint", "start", "queue", "overhead"])
    parser.add_argument(
        "--overhead-steps", type=int, default=100, help="steps of the overhead job (a few seconds on 2 CPU cores)"
    )
    parser.add_argument(
        "--overhead-pairs",
        type=int,
        default=400,
        help="at most this many plain/daemon pairs of the overhead job, ABBA order (about 10 s a pair on 2 CPU cores)",
    )
    parser.add_argument(
        "--overhead-target",
        type=float,
        default=0.018,
        help="stop the pairs once the pace ratio's 95%% interval is narrower than this either side "
        "(checked every 20 pairs from 40)",
    )
    parser.add_argument("--intake-messages", type=int, default=20_000)
    parser.add_argument("--queue-jobs", type=int, default=20, help="short jobs queued on one slot (queue start)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant (start latency)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where latest.md and latest.json go")
    asyncio.run(main(parser.parse_args()))
