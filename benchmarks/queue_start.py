"""Queue start: 20 short jobs queued on one slot, the start of every job, forked against spawned.

The requests are published at once to a daemon with one slot that is ready for its first job (its
fork server, or its first warm child, has done its imports), so every job after the first waits for
the one before it. Each job's figures come from its `succeeded` event's `durations_s`:

- `until_first_step`: the request's arrival in Kafka to the child's first optimizer step, waiting
  for the slot included (in a queue, mostly the jobs before it);
- `until_first_step - queue`: the job's own start, from taking its slot to its first step. This is
  what a warm start shortens, and what the target (p95 under 1 s) judges.

Both sides run in one run, one after the other: `child_start = "spawn"` (the earlier behaviour: the
next child starts when a job ends, so a queued job waits for its imports) and `child_start = "fork"`
(the default: every child forked from the server). Runnable alone:

    uv run python -m benchmarks.queue_start --jobs 20
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import time
from dataclasses import dataclass

from benchmarks.harness import (
    Environment,
    Row,
    markdown,
    publish_all,
    rss_mib,
    wait_for_log,
    warm_event,
)
from benchmarks.overhead import job
from daemon.resources.slots import discover_gpus
from schemas import Succeeded
from testbed.client import terminal_events

MODES = ("spawn", "fork")
STAGES = ("preflight", "load_dataset", "load_model")  # the child's own stages before training
LABEL = {"spawn": 'child_start="spawn" (before)', "fork": 'child_start="fork" (now)'}


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile: a value that was measured."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class Queue:
    first_step: list[float]  # per job, in submission order: arrival to first step
    own_start: list[float]  # per job: its start on the slot to its first step
    wall: float  # first arrival to last succeeded
    memory: float  # resident MiB of the process that makes starts warm (fork server, or a waiting child)
    stages: dict[str, float]  # median seconds of each part of a job's own start


async def queue(env: Environment, mode: str, jobs: int, steps: int) -> Queue:
    gpus = discover_gpus(None)
    settings = await env.settings(child_start=mode, job_slots=1, gpus=gpus[:1])  # one slot, GPU or CPU
    daemon = env.daemon(settings)
    try:
        await wait_for_log(daemon, warm_event(settings))  # ready for the first job, as a daemon that has waited is
        warm_pid = [
            line["pid"] for line in daemon.log_lines() if line.get("event") in ("forkserver.starting", "child.warming")
        ][0]
        memory = rss_mib(warm_pid)
        requests = [job(env, f"queue-{mode}-{index:02d}", steps=steps) for index in range(jobs)]
        started = time.monotonic()
        await publish_all(settings, requests)
        events = await terminal_events(settings, {str(r["request_id"]) for r in requests}, timeout_s=jobs * 120)
        wall = time.monotonic() - started
    finally:
        daemon.stop()
    done = [events[str(r["request_id"])][-1] for r in requests]
    for event in done:
        assert isinstance(event, Succeeded), event
    first_step = [e.durations_s["until_first_step"] for e in done if isinstance(e, Succeeded)]
    own_start = [e.durations_s["until_first_step"] - e.durations_s["queue"] for e in done if isinstance(e, Succeeded)]
    parts = {stage: [e.durations_s.get(stage, 0.0) for e in done if isinstance(e, Succeeded)] for stage in STAGES}
    parts["rest"] = [start - sum(parts[stage][i] for stage in STAGES) for i, start in enumerate(own_start)]
    return Queue(
        first_step, own_start, wall, memory, {stage: statistics.median(values) for stage, values in parts.items()}
    )


def summary(values: list[float]) -> str:
    return f"p50 {statistics.median(values):.2f}, p95 {percentile(values, 95):.2f}, max {max(values):.2f}"


async def run(env: Environment, jobs: int, steps: int = 3) -> list[Row]:
    sides = {mode: await queue(env, mode, jobs, steps) for mode in MODES}
    rows = []
    for mode, side in sides.items():
        label = LABEL[mode]
        rows += [
            Row(
                "queue start",
                f"{label}: job's own start (slot taken → first step) p50",
                round(statistics.median(side.own_start), 3),
                "s",
            ),
            Row(
                "queue start",
                f"{label}: job's own start p95",
                round(percentile(side.own_start, 95), 3),
                "s",
                "< 1 s" if mode == "fork" else "",
                note=f"{jobs} jobs of {steps} steps, one slot",
            ),
            Row(
                "queue start",
                f"{label}: job's own start max",
                round(max(side.own_start), 3),
                "s",
                note="per job: " + ", ".join(f"{v:.2f}" for v in side.own_start),
            ),
            Row(
                "queue start",
                f"{label}: arrival → first step (waiting included)",
                summary(side.first_step),
                "s",
                note="job k waits for the k-1 jobs before it",
            ),
            Row("queue start", f"{label}: first arrival → last succeeded", round(side.wall, 1), "s"),
            Row(
                "queue start",
                f"{label}: resident memory of the warm process",
                round(side.memory),
                "MiB",
                note="the fork server" if mode == "fork" else "a warm child waiting (one per free slot)",
            ),
            Row(
                "queue start",
                f"{label}: a job's own start in parts (medians)",
                "",
                "s",
                note=", ".join(f"{stage} {seconds:.3f}" for stage, seconds in side.stages.items())
                + "; rest: the child's start (fork or imports), the hand-over, trainer set-up and the first step",
            ),
        ]
    fork, spawn = sides["fork"], sides["spawn"]
    rows.append(
        Row(
            "queue start",
            "p95 own start, spawn/fork",
            round(percentile(spawn.own_start, 95) / percentile(fork.own_start, 95), 1),
            "x",
            note="the same queue, the two sides one after the other in this run",
        )
    )
    return rows


async def main(args: argparse.Namespace) -> None:
    env = Environment.start()
    try:
        rows = await run(env, args.jobs, args.steps)
    finally:
        env.stop()
    print(markdown(rows, f"queue start, {args.jobs} jobs of {args.steps} steps, one slot"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=20)
    parser.add_argument("--steps", type=int, default=3)
    asyncio.run(main(parser.parse_args()))
