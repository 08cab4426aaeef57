"""`python -m benchmarks.gpu_check`: the GPU check (issue 14), one run, one table.

On a host with an NVIDIA GPU it measures, with a model built here from a Qwen2 config (the shape of
Qwen2.5-0.5B, random weights, bf16; nothing is downloaded):

- SFT LoRA tokens/s through the daemon against the same job as a plain TRL script (benchmarks.overhead);
- a QLoRA (bitsandbytes 4-bit) job through the daemon: that it succeeds, and its tokens/s;
- GPU memory (nvidia-smi) before a job, its peak during it, and after it: back to the baseline, since
  the child holds all CUDA state and exits;
- the fork server every job's child is forked from: its imports done, CUDA never touched by it,
  before or after a job (no /dev/nvidia* file open, not among nvidia-smi's compute processes), and
  the start latency it buys;
- GRPO with vLLM colocated, when `import vllm` works;
- issue 39's rows: the aggregate tokens/s of 1, 2, 4 and 8 LoRA jobs at once on the one GPU
  (max_jobs_per_gpu) against one alone; one job with the host's speed settings on against TRL's
  defaults; a LoRA job of Qwen2.5-7B's shape as a share of the GPU's measured bf16 matmul peak.

Without CUDA (or with `--cpu`) it runs the same daemon-against-plain and fork-server rows on the tiny
model for a few steps, so the check's own path is known to work, and marks the GPU rows skipped.
`--plan` only says which rows this host would run. The table goes to stdout and to
benchmarks/results/gpu_check-<host>.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.gpu_jobs import (
    BENCH,
    QWEN2_05B,
    QWEN2_7B,
    build_qwen2_05b,
    concurrent_jobs,
    daemon_job,
    distinct_partition_ids,
    failure_text,
    grpo_request,
    long_rows,
    lora_flops_per_token,
    measured_bf16_tflops,
    sft_request,
    sft_rows,
    tokens_per_row,
    untouched,
)

RESULTS = Path(__file__).with_name("results")

@dataclass(frozen=True)
class Host:
    cuda: bool
    vllm: bool
    bitsandbytes: bool
    gpu: str = ""
    torch: str = ""


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    needs_cuda: bool = False
    needs: str = ""  # a module the check imports in the child, besides torch
    target: str = ""


CHECKS = [
    Check("sft", "SFT LoRA tokens/s: daemon against plain TRL", target=">= 0.98"),
    Check("qlora", "QLoRA 4-bit job through the daemon", needs_cuda=True, needs="bitsandbytes", target="succeeds"),
    Check("memory", "GPU memory before, during and after a job", needs_cuda=True, target="<= 16 (back to baseline)"),
    Check("warm", "fork server: CUDA untouched, the job forked from it, start latency", target="yes"),
    Check("grpo_vllm", "GRPO with vLLM colocated", needs_cuda=True, needs="vllm", target="succeeds"),
    Check("packing", "LoRA jobs at once on one GPU: aggregate tokens/s", needs_cuda=True, target=">= 3x one job alone (8 jobs)"),
    Check("fast", "the host's speed settings against TRL's defaults", needs_cuda=True, target="faster, the same losses"),
    Check("lora_7b", "a 7B-shaped LoRA job's share of the GPU's peak", needs_cuda=True, target=">= 40%"),
]


def probe(force_cpu: bool = False) -> Host:
    """What this host has, asked of a separate interpreter: this process never touches CUDA, so the
    GPU memory it reads is the daemon's and its children's only."""
    script = (
        "import json, torch; from importlib.util import find_spec as f; c = torch.cuda.is_available();"
        "print(json.dumps({'cuda': c, 'gpu': torch.cuda.get_device_name(0) if c else '', 'torch': torch.__version__,"
        "'vllm': f('vllm') is not None, 'bitsandbytes': f('bitsandbytes') is not None}))"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    if force_cpu:
        found.update(cuda=False, gpu="")
    return Host(**found)


def skip_reason(check: Check, host: Host) -> str | None:
    if check.needs_cuda and not host.cuda:
        return "skipped (no CUDA)"
    if check.needs == "vllm" and not host.vllm:
        return "skipped (vLLM not installed)"
    if check.needs == "bitsandbytes" and not host.bitsandbytes:
        return "skipped (bitsandbytes not installed)"
    return None


def plan(host: Host) -> list[tuple[Check, str | None]]:
    """Each check and why it is skipped on this host (None: it runs)."""
    return [(check, skip_reason(check, host)) for check in CHECKS]


async def run_checks(host: Host, args: argparse.Namespace) -> list[Any]:
    from benchmarks import overhead
    from benchmarks.harness import Environment, Row

    rows: list[Any] = []
    env = Environment.start()
    try:
        if host.cuda:
            model_dir = env.root / "qwen2-0.5b-shaped"
            subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--build-model", str(model_dir)], check=True)
            data = long_rows()
            model = "Qwen2 0.5B-shaped, bf16, random weights"
            sft = sft_request(model_dir, "gpu-sft", args.steps, data)
        else:
            model_dir, model = env.model_dir, "tiny Qwen2 (CPU mode)"
            sft = overhead.job(env, "cpu-sft", args.cpu_steps)
            data = sft["dataset"]["rows"]
        tokens = tokens_per_row(model_dir, data)
        steps = args.steps if host.cuda else args.cpu_steps

        memory_warm: dict[str, Any] | None = None
        for check, skip in plan(host):
            started = time.monotonic()
            if skip is not None:
                rows.append(Row(BENCH, check.title, skip, target=check.target))
                continue
            print(f"gpu_check: {check.name} ...", file=sys.stderr, flush=True)
            if check.name in ("memory", "warm") and memory_warm is None:
                # One daemon job answers both: GPU memory around it, and its warm child's CUDA state.
                request = sft_request(model_dir, "gpu-memory", max(steps // 2, 3), data) if host.cuda else overhead.job(env, "cpu-warm", 3)
                memory_warm = await daemon_job(env, request, cuda=host.cuda)
            if check.name == "sft":
                rows += await sft_rows(env, sft, steps, args.repeats, tokens, model)
            elif check.name == "qlora":
                result = await daemon_job(env, sft_request(model_dir, "gpu-qlora", args.steps, data, quantization="4bit"), cuda=True)
                if result["ok"]:
                    tput = result["final"].metrics["train_samples_per_second"] * tokens
                    rows.append(Row(BENCH, "QLoRA 4-bit: daemon tokens/s", round(tput, 1), "tokens/s", check.target,
                                    note=f"{args.steps} steps, nf4, bf16 compute; peak GPU {result['peak']:.0f} MiB"))
                else:
                    rows.append(Row(BENCH, "QLoRA 4-bit: daemon job", "FAILED", "", check.target, note=failure_text(result)))
            elif check.name == "memory" and memory_warm is not None:
                r = memory_warm
                rows += [
                    Row(BENCH, "GPU memory before a job", round(r["before"]), "MiB", note="nvidia-smi; daemon idle, warm child ready"),
                    Row(BENCH, "GPU memory peak during the job", round(r["peak"]), "MiB",
                        note="bf16 SFT LoRA, 0.5B-shaped" + ("" if r["ok"] else "; job FAILED: " + failure_text(r))),
                    Row(BENCH, "GPU memory after the job, minus before", round(r["after"] - r["before"]), "MiB", check.target, note="next warm child ready"),
                ]
            elif check.name == "warm" and memory_warm is not None:
                r = memory_warm
                first_step = r["final"].durations_s.get("until_first_step") if r["ok"] else None
                state, next_state = r["before_state"], r["next_state"]
                rows += [
                    Row(BENCH, "fork server: CUDA untouched before and after a job", "yes" if untouched(state) and untouched(next_state) else "NO", "",
                        check.target,
                        note=f"/dev/nvidia* fds {state['nvidia_fds']}, CUDA context {state['context']}, libcuda mapped {state['libcuda']}, "
                        f"torch imported {state['torch']}; after the job: fds {next_state['nvidia_fds']}, context {next_state['context']}"
                        + ("" if host.cuda else "; no CUDA on this host, so trivially yes")),
                    Row(BENCH, "the job's child was forked from the server", "yes" if r["forked_from"] == r["warm_pid"] else "NO", "", "yes",
                        note=f"server {r['warm_pid']}, job {r['job_pid']}"),
                    Row(BENCH, "warm: arrival to first step", round(first_step, 3) if first_step is not None else "FAILED", "s",
                        "" if host.cuda else "< 1 s", note=model + ("" if r["ok"] else "; job FAILED: " + failure_text(r))),
                ]
            elif check.name == "grpo_vllm":
                result = await daemon_job(env, grpo_request(model_dir, "gpu-grpo-vllm", args.grpo_steps), cuda=True)
                if result["ok"]:
                    m = result["final"].metrics
                    rows.append(Row(BENCH, "GRPO, vLLM colocated: train steps/s", round(m.get("train_steps_per_second", 0.0), 3), "steps/s", check.target,
                                    note=f"{args.grpo_steps} steps, 4 generations x 32 tokens; wall {result['wall']:.0f} s; "
                                    f"peak GPU {result['peak']:.0f} MiB, after - before {result['after'] - result['before']:+.0f} MiB"))
                else:
                    rows.append(Row(BENCH, "GRPO, vLLM colocated", "FAILED", "", check.target, note=failure_text(result)))
            elif check.name == "packing":
                rows += await packing_rows(env, model_dir, data, tokens, args.steps, check.target)
            elif check.name == "fast":
                rows += await fast_rows(env, model_dir, data, tokens, args.steps, check.target)
            elif check.name == "lora_7b":
                rows += await lora_7b_rows(env, data, args.steps, check.target)
            print(f"gpu_check: {check.name} {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    finally:
        env.stop()
    return rows


async def packing_rows(env: Any, model_dir: Path, data: list[dict[str, Any]], tokens: float, steps: int, target: str) -> list[Any]:
    """1, 2, 4 and 8 jobs at once on the GPU: the sum of their training tokens/s against one alone."""
    from benchmarks.harness import Row

    rows, alone = [], None
    for count in (1, 2, 4, 8):
        requests = [sft_request(model_dir, request_id, steps, data) for request_id in distinct_partition_ids(f"pack{count}", count)]
        result = await concurrent_jobs(env, requests)
        if not result["ok"]:
            rows.append(Row(BENCH, f"{count} jobs at once", "FAILED", "", target, note=failure_text({"final": next(
                final for final in result["finals"] if final.type != "succeeded")})))
            break
        aggregate = sum(final.metrics["train_samples_per_second"] for final in result["finals"]) * tokens
        alone = alone or aggregate
        peaks = [round((final.memory.peak_allocated_bytes or 0) / 2**30, 1) for final in result["finals"] if final.memory]
        estimate = result["finals"][0].memory.estimate_bytes if result["finals"][0].memory else None
        rows.append(Row(BENCH, f"{count} LoRA job(s) at once on one GPU: aggregate tokens/s", round(aggregate), "tokens/s",
                        target if count == 8 else "", note=f"{aggregate / alone:.2f}x one alone; wall {count * steps * 8 * tokens / result['wall']:.0f} "
                        f"tokens/s from submission to the last; peaks {peaks} GiB, estimate {round((estimate or 0) / 2**30, 1)} GiB"))
    return rows


async def fast_rows(env: Any, model_dir: Path, data: list[dict[str, Any]], tokens: float, steps: int, target: str) -> list[Any]:
    """One job with the host's speed settings on, against TRL's defaults, one after the other."""
    from benchmarks.harness import Row

    plain = await concurrent_jobs(env, [sft_request(model_dir, "fast-off", steps, data)])
    fast = await concurrent_jobs(env, [sft_request(model_dir, "fast-on", steps, data)],
                                 gradient_checkpointing_when_needed=True, fastest_attention=True, liger_kernel=True)
    if not (plain["ok"] and fast["ok"]):
        return [Row(BENCH, "speed settings", "FAILED", "", target)]
    off, on = plain["finals"][0], fast["finals"][0]
    ratio = on.metrics["train_samples_per_second"] / off.metrics["train_samples_per_second"]
    loss = abs(on.metrics["train_loss"] - off.metrics["train_loss"]) / abs(off.metrics["train_loss"])
    return [Row(BENCH, "speed settings on: tokens/s over TRL's defaults", round(ratio, 3), "x", target,
                note=f"{on.metrics['train_samples_per_second'] * tokens:.0f} vs {off.metrics['train_samples_per_second'] * tokens:.0f} tokens/s; "
                f"train_loss differs by {loss:.2e} (relative); peaks {(on.memory.peak_allocated_bytes or 0) / 2**30 if on.memory else 0:.1f} vs "
                f"{(off.memory.peak_allocated_bytes or 0) / 2**30 if off.memory else 0:.1f} GiB")]


async def lora_7b_rows(env: Any, data: list[dict[str, Any]], steps: int, target: str) -> list[Any]:
    """A LoRA job of Qwen2.5-7B's shape: its model FLOPs a second over the GPU's measured bf16 peak."""
    from benchmarks.harness import Row

    model_dir = env.root / "qwen2-7b-shaped"
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--build-model", str(model_dir), "--shape", "7b"], check=True)
    peak = measured_bf16_tflops()
    result = await concurrent_jobs(env, [sft_request(model_dir, "lora-7b", steps, data)])
    if not result["ok"]:
        return [Row(BENCH, "7B-shaped LoRA job", "FAILED", "", target, note=failure_text({"final": result["finals"][0]}))]
    final = result["finals"][0]
    rate = final.metrics["train_samples_per_second"] * tokens_per_row(model_dir, data)
    achieved = rate * lora_flops_per_token(QWEN2_7B, checkpointing=True) / 1e12
    return [Row(BENCH, "7B-shaped LoRA job: share of the measured bf16 peak", f"{100 * achieved / peak:.1f}%", "", target,
                note=f"{rate:.0f} tokens/s x 6N (checkpointing on, TRL's default) = {achieved:.0f} TFLOP/s of {peak:.0f} measured; "
                f"peak memory {(final.memory.peak_allocated_bytes or 0) / 2**30 if final.memory else 0:.1f} GiB, "
                f"estimate {(final.memory.estimate_bytes or 0) / 2**30 if final.memory else 0:.1f} GiB")]


def header(host: Host, elapsed: float | None) -> str:
    mode = f"GPU mode, {host.gpu}" if host.cuda else "CPU mode (GPU rows skipped)"
    took = f", {elapsed:.0f} s" if elapsed is not None else ""
    return (f"adapterd GPU check, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {mode}, torch {host.torch}, "
            f"vLLM {'installed' if host.vllm else 'not installed'}, {len(os.sched_getaffinity(0))} cores{took}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plan", action="store_true", help="print which rows this host runs and which it skips, run nothing")
    parser.add_argument("--cpu", action="store_true", help="CPU mode even where CUDA is available")
    parser.add_argument("--steps", type=int, default=30, help="steps of each GPU SFT job")
    parser.add_argument("--grpo-steps", type=int, default=5)
    parser.add_argument("--cpu-steps", type=int, default=40, help="steps of the CPU mode's tiny SFT job")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of plain and daemon")
    parser.add_argument("--results", type=Path, default=RESULTS, help="where gpu_check-<host>.md goes")
    parser.add_argument("--build-model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=["0.5b", "7b"], default="0.5b", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_model:
        print(build_qwen2_05b(args.build_model, shape=QWEN2_7B if args.shape == "7b" else QWEN2_05B))
        return 0

    from benchmarks.harness import Row, markdown

    host = probe(force_cpu=args.cpu)
    if args.plan:
        rows = [Row(BENCH, check.title, skip or "runs") for check, skip in plan(host)]
        print(markdown(rows, header(host, None)))
        return 0
    started = time.monotonic()
    rows = asyncio.run(run_checks(host, args))
    table = markdown(rows, header(host, time.monotonic() - started))
    print(table)
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / f"gpu_check-{platform.node()}.md").write_text(table)
    failed = any(str(row.value) in ("FAILED", "NO") for row in rows)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
