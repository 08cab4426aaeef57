"""Overhead against plain TRL: the same SFT LoRA job as a plain script and through the daemon."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from benchmarks.harness import Environment, Row, cpu_seconds, wait_for_log, warm_event
from schemas import Succeeded
from tests.helpers import CHAT_ROWS, run_to_end


def job(env: Environment, request_id: str, steps: int) -> dict[str, object]:
    return {
        "schema_version": 1,
        "request_id": request_id,
        "method": "sft",
        "model": {"id": str(env.model_dir)},
        "dataset": {"rows": CHAT_ROWS * 8},
        "peft": {"r": 8, "lora_alpha": 16, "lora_dropout": 0.0, "target_modules": "all-linear", "use_rslora": False, "use_dora": False},
        "training": {"max_steps": steps, "learning_rate": 1e-3, "per_device_train_batch_size": 4},
        "output": {"repo_id": f"bench/{request_id}"},
    }


def plain_run(env: Environment, steps: int, request: dict[str, object] | None = None) -> tuple[float, float]:
    """Wall time (process start to exit) and throughput of the plain script (`request`: another job
    than the tiny model's, as benchmarks/gpu_check.py runs)."""
    request_file = env.root / "plain-request.json"
    request_file.write_text(json.dumps(request or job(env, "plain", steps)))
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "benchmarks.plain_sft", str(request_file)], check=True, capture_output=True, text=True)
    wall = time.monotonic() - started
    return wall, json.loads(out.stdout.strip().splitlines()[-1])["train_samples_per_second"]


async def daemon_run(env: Environment, steps: int, index: int, request: dict[str, object] | None = None) -> dict[str, float]:
    """One job through a fresh daemon, its warm child ready as between jobs: wall time (submission to
    `succeeded`), push time, the trainer's own throughput, and the CPU seconds the daemon (the parent,
    not its child) and the broker spent while the job ran."""
    settings = await env.settings()
    daemon = env.daemon(settings)
    try:
        await wait_for_log(daemon, warm_event(settings))
        assert daemon.process is not None
        parent_cpu, broker_cpu = cpu_seconds(daemon.process.pid), env.broker_cpu_seconds()
        started = time.monotonic()
        events = await run_to_end(settings, {**request, "request_id": f"{request['request_id']}-{index}"} if request else job(env, f"through-daemon-{index}", steps))
        wall = time.monotonic() - started
        parent_cpu, broker_cpu = cpu_seconds(daemon.process.pid) - parent_cpu, env.broker_cpu_seconds() - broker_cpu
    finally:
        daemon.stop()
    done = events[-1]
    assert isinstance(done, Succeeded), done
    return {"wall": wall, "push": done.durations_s["push"], "throughput": done.metrics["train_samples_per_second"],
            "train_s": done.durations_s["train"], "parent_cpu": parent_cpu, "broker_cpu": broker_cpu}


def spread(values: list[float]) -> str:
    """The median and the range of the values, as `median [min, max]`."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


async def run(env: Environment, steps: int, pairs: int) -> list[Row]:
    """`pairs` pairs of one plain run and one daemon run, the order swapped every other pair (ABBA),
    so slow drift of the shared machine falls on both sides alike. Each pair gives one ratio; the
    ratios' median and range are reported: the range says whether the figure can judge a 2% target.
    Throughput is the trainer's own (`train_samples_per_second`: samples over its training loop's time)."""
    plain: list[tuple[float, float]] = []
    daemon: list[dict[str, float]] = []
    for index in range(pairs):
        if index % 2 == 0:
            plain.append(plain_run(env, steps))
            daemon.append(await daemon_run(env, steps, index))
        else:
            daemon.append(await daemon_run(env, steps, index))
            plain.append(plain_run(env, steps))
    ratios = [d["throughput"] / t for d, (_, t) in zip(daemon, plain, strict=True)]
    wall_ratios = [(d["wall"] - d["push"]) / w for d, (w, _) in zip(daemon, plain, strict=True)]
    plain_tput = [t for _, t in plain]
    daemon_tput = [d["throughput"] for d in daemon]
    parent = [d["parent_cpu"] / d["train_s"] for d in daemon]
    broker = [d["broker_cpu"] / d["train_s"] for d in daemon]
    runs = f"{pairs} pairs, ABBA order, {steps} steps"
    rel = (max(ratios) - min(ratios)) / 2 / statistics.median(ratios)
    return [
        Row("overhead", "throughput ratio daemon/plain, per pair: median [min, max]", spread(ratios), "", ">= 0.98",
            note=f"{runs}; half-range ±{rel:.1%}"),
        Row("overhead", "plain TRL throughput: median [min, max]", spread(plain_tput), "samples/s", note="the trainer's own timing"),
        Row("overhead", "daemon throughput: median [min, max]", spread(daemon_tput), "samples/s", note="the trainer's own timing"),
        Row("overhead", "wall-time ratio daemon/plain, push excluded: median [min, max]", spread(wall_ratios), "", "<= 1.05",
            note="daemon: submission to succeeded, warm child; plain: process start to exit"),
        Row("overhead", "daemon process CPU while training", spread(parent), "cores", note="CPU seconds of the parent / training seconds"),
        Row("overhead", "broker CPU while training", spread(broker), "cores", note="the local Kafka broker's JVM"),
    ]
