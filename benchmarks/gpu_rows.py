"""The GPU check's rows of jobs through the daemon (benchmarks/gpu_check.py says which run where; the
rows that measure packing and speed are in benchmarks/gpu_speed.py): each a function of the run's
context, the daemon the rows share and its check, writing its rows to the table."""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.gpu_daemon import Daemon, plain
from benchmarks.gpu_jobs import cuda_state, gpu_compute_pids, sft_request, sharded_request, tokens_per_row, untouched
from benchmarks.gpu_table import Check, Table

GIB = 2**30


@dataclass
class Run:
    """What the rows share: the table, the options, the model and rows the SFT jobs train on."""

    table: Table
    args: argparse.Namespace
    cuda: bool
    model: Path
    rows: list[dict[str, Any]]
    tokens: float
    steps: int
    run_id: str = field(
        default_factory=lambda: time.strftime("%H%M%S")
    )  # a request id that succeeded in a work folder is not trained again
    daemon_sft: list[dict[str, Any]] = field(default_factory=list)
    server: int | None = None

    def sft(self, rid: str, model: Path | None = None, **kw: Any) -> dict[str, Any]:
        request = sft_request(model or self.model, f"{rid}-{self.run_id}", self.steps, self.rows, **kw)
        if not self.cuda:
            request["training"]["bf16"] = False
            request["model"]["dtype"] = "float32"
            request["training"]["per_device_train_batch_size"] = 4
        return request

    def build(self, name: str, *flags: str) -> Path:
        """A Qwen2 of a real model's shape, random weights, bf16, in a child interpreter
        (torch stays out of this one)."""
        path = self.args.root / name
        if not (path / "config.json").exists():
            subprocess.run(
                [sys.executable, "-m", "benchmarks.gpu_check", "--build-model", str(path), *flags], check=True
            )  # its errors shown
        return path

    def samples(self, final: dict[str, Any]) -> float:
        return float(final["metrics"]["train_samples_per_second"])


def brief(final: dict[str, Any]) -> str:
    if final.get("type") == "succeeded":
        return (
            f"samples/s {final['metrics'].get('train_samples_per_second')}, median step "
            f"{final['metrics'].get('median_step_s')} s"
        )
    return json.dumps({k: final.get(k) for k in ("type", "code", "message", "errors", "stage")}, default=str)[:500]


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f}, max {max(values):.3f}, n {len(values)}" if values else "no runs"


def gib(memory: dict[str, Any] | None, key: str) -> float:
    return round(((memory or {}).get(key) or 0) / GIB, 2)


async def warm_before(run: Run, daemon: Daemon, check: Check) -> None:
    run.server = daemon.forkserver_pid()
    state = cuda_state(run.server) if run.server else {}
    ready = next(
        (
            line
            for line in daemon.children_log().splitlines()
            if "fork server" in line and ("ready" in line or "refused" in line)
        ),
        "no line",
    )
    run.table.row(
        "fork server before any job",
        "ready" if run.server and untouched(state) else "NOT READY",
        f"pid {run.server}; {json.dumps(state)}; {ready.split(': ', 1)[-1][:200]}",
        check.target,
    )


async def warm_after(run: Run, daemon: Daemon, check: Check) -> None:
    after = daemon.forkserver_pid()
    state = cuda_state(after) if after else {}
    run.table.row(
        "fork server after the jobs",
        "same server, CUDA untouched" if after == run.server and state and untouched(state) else "CHANGED",
        f"pid {run.server} -> {after}; {json.dumps(state)}; compute pids {sorted(gpu_compute_pids())}",
        check.target,
    )


async def sft(run: Run, daemon: Daemon, check: Check) -> None:
    table, plain_runs = run.table, []
    for index, side in enumerate(run.args.order.split(",")):
        if table.left() < 120:
            table.say("budget: no more SFT runs")
            break
        try:
            if side == "P":
                [result] = plain(run.args.root, run.sft(f"plain-{index}"))
                plain_runs.append(result)
            else:
                run.daemon_sft.append(await daemon.job(run.sft(f"daemon-{index}"), timeout_s=min(400, table.left())))
        except Exception:
            table.row(f"SFT run {index} ({side})", "FAILED", traceback.format_exc()[-1200:])
    done = [r for r in run.daemon_sft if r["final"]["type"] == "succeeded"]
    p_tput = [r["train_samples_per_second"] * run.tokens for r in plain_runs]
    d_tput = [run.samples(r["final"]) * run.tokens for r in done]
    if p_tput:
        table.row(
            "SFT LoRA tokens/s: plain TRL",
            round(statistics.median(p_tput), 1),
            f"runs {[round(t) for t in p_tput]}; {run.model.name}, {run.steps} steps",
        )
        table.row(
            "plain TRL process wall (s)",
            [round(r["wall"], 1) for r in plain_runs],
            "imports, model, training: a cold start",
        )
    if d_tput:
        table.row(
            "SFT LoRA tokens/s: daemon", round(statistics.median(d_tput), 1), f"runs {[round(t) for t in d_tput]}"
        )
        table.row(
            "arrival to first step, daemon (s)",
            [round(r["final"]["durations_s"].get("until_first_step", -1), 1) for r in done],
            f"children forked from the server: {sum(r['forked'] for r in done)} of {len(done)}",
        )
        table.row(
            "stages of a daemon SFT job (s)",
            json.dumps({k: v for k, v in done[-1]["final"]["durations_s"].items() if k != "queue"}),
        )
    if p_tput and d_tput:
        ratios = [d / p for d in d_tput for p in p_tput]
        table.row(
            "tokens/s ratio daemon/plain",
            round(statistics.median(ratios), 3),
            f"every daemon run over every plain run: {spread(ratios)}",
            check.target,
        )
        p_step, d_step = (
            [r["median_step_s"] for r in plain_runs],
            [r["final"]["metrics"]["median_step_s"] for r in done],
        )
        table.row(
            "median step plain / daemon (ms)",
            f"{statistics.median(p_step) * 1000:.1f} / {statistics.median(d_step) * 1000:.1f}",
            f"plain {[round(s * 1000, 1) for s in p_step]}, daemon {[round(s * 1000, 1) for s in d_step]}",
        )
    if len(done) < len(run.daemon_sft):
        table.row(
            "daemon SFT", "FAILED", brief(next(r for r in run.daemon_sft if r["final"]["type"] != "succeeded")["final"])
        )


async def memory(run: Run, daemon: Daemon, check: Check) -> None:
    jobs = run.daemon_sft or [await daemon.job(run.sft("memory"), timeout_s=min(400, run.table.left()))]
    run.table.row(
        "GPU MiB before / peak / after (daemon SFT jobs)",
        [[round(r["before"]), round(r["peak"]), round(r["after"])] for r in jobs],
        "nvidia-smi; the daemon idle with its fork server ready before each",
    )
    run.table.row(
        "GPU memory after a job, minus before (MiB)",
        round(max(r["after"] - r["before"] for r in jobs)),
        "the most of the jobs above",
        check.target,
    )


async def one_job(
    run: Run, daemon: Daemon, title: str, request: dict[str, Any], target: str, timeout_s: float = 240
) -> dict[str, Any] | None:
    try:
        result = await daemon.job(request, timeout_s=min(timeout_s, run.table.left() - 15))
    except Exception:
        run.table.row(title, "ERROR", traceback.format_exc()[-1200:], target)
        return None
    note = f"{result['wall']:.1f} s; {'forked' if result['forked'] else 'NOT forked'}; {brief(result['final'])}"
    if result["native"]:
        note += f"; bitsandbytes library in the child: {', '.join(result['native'])}"
    if run.cuda:
        note += f"; GPU MiB before {result['before']:.0f}, peak {result['peak']:.0f}, after {result['after']:.0f}"
    run.table.row(title, result["final"]["type"], note, target)
    return result


async def qlora(run: Run, daemon: Daemon, check: Check) -> None:
    await one_job(
        run,
        daemon,
        "QLoRA 4-bit SFT (0.5B-shaped) through the daemon",
        run.sft("qlora", quantization="4bit"),
        check.target,
    )


async def grpo_vllm(run: Run, daemon: Daemon, check: Check) -> None:
    from benchmarks.gpu_jobs import grpo_request

    model = run.build("qwen05b-padded", "--pad-tokenizer")  # vLLM samples every id: each must decode
    await one_job(
        run,
        daemon,
        "GRPO, vLLM colocated (0.5B-shaped)",
        grpo_request(model, f"grpo-vllm-{run.run_id}", run.args.grpo_steps),
        check.target,
        400,
    )


async def methods(run: Run, daemon: Daemon, check: Check) -> None:
    from importlib.metadata import version

    from daemon.cli.demo.requests import demo_request
    from schemas.methods import METHODS, unsupported_reason

    shipped = [name for name in METHODS if unsupported_reason(name, version("trl")) is None]
    wanted = run.args.methods.split(",") if run.args.methods else shipped
    for name in [m for m in shipped if m in wanted]:
        request = json.loads(demo_request(name, run.args.root / "tiny").model_dump_json(exclude_none=True))
        request["request_id"] = f"method-{name}-{run.run_id}"
        if run.cuda:
            request.setdefault("training", {})["bf16"] = True
            request["model"]["dtype"] = "bfloat16"
        title = f"{name} (demo request, tiny model{', bf16 on the GPU' if run.cuda else ', CPU'})"
        if run.table.left() < 30:
            run.table.row(title, "not run (budget)")
            continue
        await one_job(run, daemon, title, request, check.target)


async def sharded(run: Run, daemon: Daemon, check: Check) -> None:
    """A model whose whole copy does not fit one of the host's GPUs (a full fine-tune of Qwen2.5-7B's shape), across all
    of them, `resources.shard` left to the daemon: the plan it chose (`accepted.plan`, sharded only where a whole copy's
    estimate is over a GPU's room), tokens/s, and each GPU's allocator peak
    (`rank<r>_peak_bytes`) against the estimate."""
    gpus = run.table.host.gpus
    title = f"7B-shaped full fine-tune across {gpus} GPUs, sharded by the daemon's plan"
    if run.table.left() < 300:
        run.table.row(title, "not run (budget)", target=check.target)
        return
    model = run.build("qwen7b", "--shape", "7b")
    request = sharded_request(model, f"sharded-{run.run_id}", run.steps, run.rows, gpus)
    final = (await daemon.job(request, timeout_s=min(600, run.table.left())))["final"]
    accepted = next((e for e in daemon.events(request["request_id"]) if e["type"] == "accepted"), {})
    if final["type"] != "succeeded":
        run.table.row(title, "FAILED", f"plan {accepted.get('plan')}; {brief(final)}", check.target)
        return
    metrics = final["metrics"]
    peaks = [round(metrics.get(f"rank{rank}_peak_bytes", 0) / GIB, 2) for rank in range(gpus)]
    held = [round(metrics.get(f"rank{rank}_param_bytes", 0) / GIB, 2) for rank in range(gpus)]
    rate = run.samples(final) * tokens_per_row(model, run.rows)
    value = (
        f"{rate:.0f} tokens/s"
        if accepted.get("plan") == "sharded"
        else f"not sharded: plan {accepted.get('plan')} ({rate:.0f} tokens/s)"
    )
    run.table.row(
        title,
        value,
        f"per-GPU peak {peaks} GiB (allocator), estimate "
        f"{round((accepted.get('estimate_bytes_per_gpu') or 0) / GIB, 2)} GiB a GPU; parameters held {held} GiB a GPU; "
        f"median step {metrics.get('median_step_s')} s",
        check.target,
    )
