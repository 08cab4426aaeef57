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
- GRPO with vLLM colocated, when `import vllm` works.

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
    build_qwen2_05b,
    daemon_job,
    failure_text,
    grpo_request,
    long_rows,
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
            print(f"gpu_check: {check.name} {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    finally:
        env.stop()
    return rows


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
    args = parser.parse_args(argv)
    if args.build_model:
        print(build_qwen2_05b(args.build_model))
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
