"""Overhead against plain TRL: the same SFT LoRA job as a plain script and through the daemon."""

from __future__ import annotations

import json
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


async def run(env: Environment, steps: int) -> list[Row]:
    # (a) the plain script, wall time from process start to exit
    request_file = env.root / "plain-request.json"
    request_file.write_text(json.dumps(job(env, "plain", steps)))
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "benchmarks.plain_sft", str(request_file)], check=True, capture_output=True, text=True)
    plain_wall = time.monotonic() - started
    plain = json.loads(out.stdout.strip().splitlines()[-1])

    # (b) the daemon, with its warm child ready as it is between jobs: wall time from submission to `succeeded`
    settings = await env.settings()
    daemon = env.daemon(settings)
    try:
        await wait_for_log(daemon, "child.warm_ready")
        started = time.monotonic()
        events = await run_to_end(settings, job(env, "through-daemon", steps))
        daemon_wall = time.monotonic() - started
    finally:
        daemon.stop()
    done = events[-1]
    assert isinstance(done, Succeeded), done
    push = done.durations_s["push"]

    plain_tput, daemon_tput = plain["train_samples_per_second"], done.metrics["train_samples_per_second"]
    return [
        Row("overhead", "plain TRL script: wall time", round(plain_wall, 2), "s", note=f"{steps} steps, process start to exit"),
        Row("overhead", "daemon: submission to succeeded", round(daemon_wall, 2), "s", note="warm child ready"),
        Row("overhead", "daemon: Hub push (in the above)", round(push, 3), "s"),
        Row("overhead", "wall-time ratio daemon/plain, push excluded", round((daemon_wall - push) / plain_wall, 3), "", "<= 1.05"),
        Row("overhead", "plain TRL throughput", round(plain_tput, 2), "samples/s"),
        Row("overhead", "daemon throughput", round(daemon_tput, 2), "samples/s"),
        Row("overhead", "throughput ratio daemon/plain", round(daemon_tput / plain_tput, 3), "", ">= 0.98"),
    ]
