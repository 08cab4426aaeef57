"""Overhead against plain TRL: the same SFT LoRA job as a plain script and through the daemon."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time

from benchmarks.harness import Environment, Row, wait_for_log
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


async def daemon_run(env: Environment, steps: int, index: int, request: dict[str, object] | None = None) -> tuple[float, float, float]:
    """Wall time (submission to `succeeded`, the warm child ready as between jobs), push time, throughput."""
    settings = await env.settings()
    daemon = env.daemon(settings)
    try:
        await wait_for_log(daemon, "child.warm_ready")
        started = time.monotonic()
        events = await run_to_end(settings, {**request, "request_id": f"{request['request_id']}-{index}"} if request else job(env, f"through-daemon-{index}", steps))
        wall = time.monotonic() - started
    finally:
        daemon.stop()
    done = events[-1]
    assert isinstance(done, Succeeded), done
    return wall, done.durations_s["push"], done.metrics["train_samples_per_second"]


async def run(env: Environment, steps: int, repeats: int) -> list[Row]:
    """Plain and daemon runs alternate, so both see the same machine; medians are reported."""
    plain, daemon = [], []
    for index in range(repeats):
        plain.append(plain_run(env, steps))
        daemon.append(await daemon_run(env, steps, index))
    plain_wall = statistics.median(w for w, _ in plain)
    plain_tput = statistics.median(t for _, t in plain)
    daemon_wall = statistics.median(w for w, _, _ in daemon)
    push = statistics.median(p for _, p, _ in daemon)
    daemon_tput = statistics.median(t for _, _, t in daemon)
    runs = f"{repeats} alternating runs each"
    return [
        Row("overhead", "plain TRL script: wall time (median)", round(plain_wall, 2), "s", note=f"{steps} steps, process start to exit; {runs}"),
        Row("overhead", "daemon: submission to succeeded (median)", round(daemon_wall, 2), "s", note="warm child ready"),
        Row("overhead", "daemon: Hub push (in the above)", round(push, 3), "s"),
        Row("overhead", "wall-time ratio daemon/plain, push excluded", round((daemon_wall - push) / plain_wall, 3), "", "<= 1.05"),
        Row("overhead", "plain TRL throughput (median)", round(plain_tput, 2), "samples/s", note=str([round(t, 1) for _, t in plain])),
        Row("overhead", "daemon throughput (median)", round(daemon_tput, 2), "samples/s", note=str([round(t, 1) for _, _, t in daemon])),
        Row("overhead", "throughput ratio daemon/plain", round(daemon_tput / plain_tput, 3), "", ">= 0.98"),
    ]
