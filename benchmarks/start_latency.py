"""Start latency: from a request's arrival in Kafka to the first optimizer step, cold and warm."""

from __future__ import annotations

import statistics

from benchmarks.harness import Environment, Row, wait_for_log, warm_event
from benchmarks.overhead import job
from schemas import Succeeded
from testbed.client import run_to_end


async def first_steps(env: Environment, warm: bool, repeats: int) -> tuple[list[float], dict[str, float]]:
    settings = await env.settings(warm_child=warm)
    daemon = env.daemon(settings)
    seconds = []
    try:
        for index in range(repeats):
            if warm:
                # A warm start is a request that finds the fork server ready (it serves every round).
                await wait_for_log(daemon, warm_event(settings))
            done = (await run_to_end(settings, job(env, f"{'warm' if warm else 'cold'}-{index}", steps=3)))[-1]
            assert isinstance(done, Succeeded), done
            seconds.append(done.durations_s["until_first_step"])
    finally:
        daemon.stop()
    return seconds, done.durations_s


async def run(env: Environment, repeats: int) -> list[Row]:
    cold, _ = await first_steps(env, warm=False, repeats=repeats)
    warm, stages = await first_steps(env, warm=True, repeats=repeats)
    breakdown = ", ".join(
        f"{k} {v:.2f}" for k, v in stages.items() if k in ("queue", "preflight", "load_dataset", "load_model")
    )
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return [
        Row(
            "start latency",
            "cold: arrival to first step (median)",
            round(cold_s, 3),
            "s",
            note=f"{repeats} requests: {[round(s, 2) for s in cold]}",
        ),
        Row(
            "start latency",
            "warm: arrival to first step (median)",
            round(warm_s, 3),
            "s",
            "< 1 s",
            note=f"{repeats} requests: {[round(s, 2) for s in warm]}",
        ),
        Row("start latency", "speed-up cold/warm", round(cold_s / warm_s, 2), "x", ">= 5"),
        Row(
            "start latency",
            "warm: stages before training (last run)",
            "",
            "s",
            note=breakdown + "; the rest is trainer set-up and the first step",
        ),
    ]
