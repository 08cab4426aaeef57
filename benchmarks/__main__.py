"""`python -m benchmarks`: every benchmark, side by side in one run on this machine.

Prints a table and writes it to benchmarks/results/latest.json and latest.md.
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

from benchmarks import footprint, intake, overhead, queue_start, start_latency
from benchmarks.harness import Environment, Row, markdown

RESULTS = Path(__file__).with_name("results")


async def main(args: argparse.Namespace) -> None:
    env = Environment.start()
    rows: list[Row] = []
    started = time.monotonic()
    try:
        if "intake" in args.only:
            rows += await intake.run(env, args.intake_messages)
        if "footprint" in args.only:
            rows += await footprint.run(env)
        if "start" in args.only:
            rows += await start_latency.run(env, args.repeats)
        if "queue" in args.only:
            rows += await queue_start.run(env, args.queue_jobs)
        if "overhead" in args.only:
            rows += await overhead.run(env, args.overhead_steps, args.overhead_pairs, args.overhead_target)
    finally:
        env.stop()
    header = (f"adapterd benchmarks, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
              f"{platform.processor() or platform.machine()}, {len(__import__('os').sched_getaffinity(0))} cores, "
              f"{time.monotonic() - started:.0f} s")
    table = markdown(rows, header)
    print(table)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "latest.md").write_text(table)
    (args.results / "latest.json").write_text(json.dumps({"header": header, "rows": [asdict(r) for r in rows]}, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=["intake", "footprint", "start", "queue", "overhead"])
    parser.add_argument("--overhead-steps", type=int, default=100, help="steps of the overhead job (a few seconds on 2 CPU cores)")
    parser.add_argument("--overhead-pairs", type=int, default=400,
                        help="at most this many plain/daemon pairs of the overhead job, ABBA order (about 10 s a pair on 2 CPU cores)")
    parser.add_argument("--overhead-target", type=float, default=0.018,
                        help="stop the pairs once the pace ratio's 95%% interval is narrower than this either side (checked every 20 pairs from 40)")
    parser.add_argument("--intake-messages", type=int, default=20_000)
    parser.add_argument("--queue-jobs", type=int, default=20, help="short jobs queued on one slot (queue start)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant (start latency)")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where latest.md and latest.json go")
    asyncio.run(main(parser.parse_args()))
