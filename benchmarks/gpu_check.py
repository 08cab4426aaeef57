"""`python -m benchmarks.gpu_check`: the GPU check (issues 14, 38, 39), one run, one table.

It runs where a GPU check is lent: a bare machine with Python and its own torch, no JVM, no network,
no uv (benchmarks/gpu_check.sh installs the wheels benchmarks/gpu_wheels.py built, then runs this).
So the daemon is adapterd's real `Service` on Kafka in memory (benchmarks/gpu_daemon.py), beside plain
TRL (benchmarks/plain_sft.py). On a GPU the SFT model is of Qwen2.5-0.5B's shape (random weights,
bf16, built here; nothing is downloaded). Its rows (`--plan` lists them and which this host runs):

- warm: the fork server ready, CUDA untouched in it before and after the jobs, each job forked from it;
- sft: SFT LoRA tokens/s through the daemon against plain TRL in ABBA order, the median step, arrival
  to first step, the stages of a job (`durations_s`);
- memory: GPU memory (nvidia-smi) before each daemon job, its peak and after it (back to the baseline);
- qlora: a QLoRA 4-bit job through the daemon;
- packing: 1, 2, 4 and 8 LoRA jobs at once on one GPU through the daemon's own packing
  (`max_jobs_per_gpu`, daemon/resources/slots.py): their aggregate tokens/s against one alone;
- fast: one job with the host's speed settings on against TRL's defaults, through the daemon;
- lora_7b: a LoRA job of Qwen2.5-7B's shape as a share of the GPU's measured bf16 matmul peak;
- plain_at_once, checkpointing: plain TRL jobs at once with no daemon, and one with gradient
  checkpointing off against TRL's default (on): the figures packing and the speed settings stand on;
- grpo_vllm: GRPO with vLLM colocated, where vLLM is installed;
- sharded: a full fine-tune of Qwen2.5-7B's shape, whose whole copy fits no 80 GB GPU, across every GPU of the
  host, sharded by the daemon's own plan: tokens/s and each GPU's peak; where the host has two GPUs or more
  ("skipped: one GPU" otherwise);
- methods: one job of every method this TRL ships, on the tiny model.

Without CUDA (or with `--cpu`) the same rows run on the tiny model for a few steps, the GPU rows
skipped; packing runs there too, two jobs sharing one declared GPU that the children cannot see, so
the check's own path, the daemon's packing included, is known to work on any machine. It starts no
row when its budget (`--budget-s`) runs low; `--only` picks rows. The table is written after each row
(JSON and Markdown, to `--out`), so a run stopped at its limit keeps what it had.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path

from benchmarks.gpu_table import Check, Host, Table

CHECKS = [
    Check(
        "warm", "fork server: ready, CUDA untouched before and after the jobs, each job forked from it", target="yes"
    ),
    Check("sft", "SFT LoRA tokens/s: daemon against plain TRL (ABBA), first step, stages", target=">= 0.98"),
    Check(
        "memory",
        "GPU memory before, peak during and after each daemon job",
        needs_cuda=True,
        target="after - before <= 16 MiB",
    ),
    Check("qlora", "QLoRA 4-bit job through the daemon", needs_cuda=True, needs="bitsandbytes", target="succeeds"),
    Check(
        "packing",
        "LoRA jobs at once on one GPU through max_jobs_per_gpu: aggregate tokens/s",
        target=">= 3x one job alone (8 jobs)",
    ),
    Check(
        "fast",
        "the host's speed settings against TRL's defaults, through the daemon",
        needs_cuda=True,
        target="faster, the same losses",
    ),
    Check("lora_7b", "a 7B-shaped LoRA job's share of the GPU's measured bf16 peak", needs_cuda=True, target=">= 40%"),
    Check(
        "plain_at_once",
        "plain TRL SFT jobs at once on one GPU, no daemon: aggregate tokens/s",
        needs_cuda=True,
        target="measured",
    ),
    Check(
        "checkpointing",
        "plain SFT, gradient checkpointing off against TRL's default (on)",
        needs_cuda=True,
        target="measured",
    ),
    Check("grpo_vllm", "GRPO with vLLM colocated", needs_cuda=True, needs="vllm", target="succeeds"),
    Check(
        "sharded",
        "a model whose whole copy fits no one GPU, trained sharded across the host's GPUs: tokens/s, per-GPU peak",
        needs_cuda=True,
        min_gpus=2,
        target="plan sharded; succeeds",
    ),
    Check("methods", "one job of every method this TRL ships (demo requests, tiny model)", target="each succeeds"),
]


def probe(force_cpu: bool = False) -> Host:
    """What this host has, asked of another interpreter: this one never touches CUDA, so the GPU
    memory it reads is the daemon's and its children's only."""
    script = (
        "import json, torch, importlib.metadata as m; from importlib.util import find_spec as f; c = "
        "torch.cuda.is_available(); v = {}\n"
        "for p in "
        "['torch','transformers','trl','peft','datasets','accelerate','bitsandbytes','vllm','pydantic','aiokafka']:\n"
        "  try: v[p] = m.version(p)\n  except Exception: v[p] = 'missing'\n"
        "print(json.dumps({'cuda': c, 'gpu': torch.cuda.get_device_name(0) if c else '', 'gpus': "
        "torch.cuda.device_count() if c else 0, 'vllm': f('vllm') is not None, 'bitsandbytes': f('bitsandbytes') is "
        "not None, 'versions': sorted(v.items())}))"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    found = json.loads(out.strip().splitlines()[-1])
    found["versions"] = tuple(tuple(pair) for pair in found["versions"])
    if force_cpu:
        found.update(cuda=False, gpu="", gpus=0)
    return Host(**found)


def skip_reason(check: Check, host: Host, only: set[str] | None = None) -> str | None:
    if only is not None and check.name not in only:
        return "not asked (--only)"
    if check.needs_cuda and not host.cuda:
        return "skipped (no CUDA)"
    if check.min_gpus > 1 and host.gpus < check.min_gpus:
        return "skipped: one GPU"
    if check.needs == "vllm" and not host.vllm:
        return "skipped (vLLM not installed)"
    if check.needs == "bitsandbytes" and not host.bitsandbytes:
        return "skipped (bitsandbytes not installed)"
    return None


def plan(host: Host, only: set[str] | None = None) -> list[tuple[Check, str | None]]:
    """Each check and why it is skipped on this host (None: it runs)."""
    return [(check, skip_reason(check, host, only)) for check in CHECKS]


def row_functions() -> dict[str, Callable[..., Awaitable[None]]]:
    """Each check's function but warm's (read before and after the others): (run, daemon, check)."""
    from benchmarks import gpu_rows, gpu_speed

    return {
        "sft": gpu_rows.sft,
        "memory": gpu_rows.memory,
        "qlora": gpu_rows.qlora,
        "packing": gpu_speed.packing,
        "fast": gpu_speed.fast,
        "lora_7b": gpu_speed.lora_7b,
        "plain_at_once": gpu_speed.plain_at_once,
        "checkpointing": gpu_speed.checkpointing,
        "grpo_vllm": gpu_rows.grpo_vllm,
        "sharded": gpu_rows.sharded,
        "methods": gpu_rows.methods,
    }


async def run_checks(table: Table, args: argparse.Namespace, checks: list[Check]) -> None:
    """The rows of `checks`, in the plan's order, through one daemon (packing and the speed settings
    start daemons of their own beside it), then the fork server's state after them all."""
    from benchmarks.gpu_daemon import Daemon
    from benchmarks.gpu_jobs import gpu_used_mib, long_rows, tokens_per_row
    from benchmarks.gpu_rows import Run, warm_after, warm_before

    rows, root, cuda = row_functions(), args.root, table.host.cuda
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "handlers.fixtures.tiny_model", str(root / "tiny")], check=True, capture_output=True
    )
    subprocess.run(
        [sys.executable, "-m", "handlers.fixtures.tiny_model", str(root / "tiny-teacher"), "1"],
        check=True,
        capture_output=True,
    )
    if cuda:
        # The tokenizer is the tiny one, not padded to the model's 151,936 ids: the model computes every
        # logit all the same, and tokenizing stays fast (a padded one made load_model's figure meaningless).
        run = Run(table, args, cuda, root / "qwen05b", long_rows(), 0.0, args.steps)
        run.build("qwen05b")
    else:
        from testbed.data import CHAT_ROWS

        run = Run(table, args, cuda, root / "tiny", CHAT_ROWS * 8, 0.0, min(args.steps, 6))
    run.tokens = tokens_per_row(run.model, run.rows)
    table.say("models built; tokens a row", round(run.tokens, 1))
    daemon = Daemon(root / "work", [root], cuda)
    await daemon.start()
    names = {check.name for check in checks}
    try:
        if "warm" in names:
            await warm_before(run, daemon, next(c for c in checks if c.name == "warm"))
        for check in checks:
            if check.name in rows:
                table.say("row", check.name)
                try:
                    await rows[check.name](run, daemon, check)
                except Exception:
                    table.row(check.title, "ERROR", traceback.format_exc()[-1200:], check.target)
        if "warm" in names:
            await warm_after(run, daemon, next(c for c in checks if c.name == "warm"))
    finally:
        await daemon.stop()
    if cuda:
        table.row("GPU MiB after the daemon stopped", gpu_used_mib())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--plan", action="store_true", help="print every row and whether this host runs it; run nothing"
    )
    parser.add_argument("--cpu", action="store_true", help="CPU mode on a GPU host")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated rows to run (default: every one): " + ",".join(c.name for c in CHECKS),
    )
    parser.add_argument(
        "--steps", type=int, default=30, help="optimizer steps of each SFT job on the GPU (CPU mode: at most 6)"
    )
    parser.add_argument("--order", default="P,D,D,P", help="plain (P) and daemon (D) SFT runs, in order")
    parser.add_argument(
        "--packing",
        default="1,2,4,8",
        help="how many jobs at once through max_jobs_per_gpu, each a row (CPU mode: at most 2)",
    )
    parser.add_argument("--concurrent", default="2,4", help="how many plain jobs at once on one GPU, each a row")
    parser.add_argument("--methods", default="", help="comma-separated methods to run one job of (default: every one)")
    parser.add_argument("--grpo-steps", type=int, default=5)
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no row that would run past this")
    parser.add_argument("--root", type=Path, default=Path("/tmp/adapterd-gpu-check"))
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "benchmarks/results")))
    parser.add_argument("--build-model", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=["0.5b", "7b"], default="0.5b", help=argparse.SUPPRESS)
    parser.add_argument("--pad-tokenizer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.build_model:
        from benchmarks.gpu_jobs import QWEN2_05B, QWEN2_7B, build_qwen2_05b

        print(
            build_qwen2_05b(
                args.build_model, pad_tokenizer=args.pad_tokenizer, shape=QWEN2_7B if args.shape == "7b" else QWEN2_05B
            )
        )
        return 0
    only = {name for name in args.only.split(",") if name} or None
    unknown = (only or set()) - {check.name for check in CHECKS}
    if unknown:
        parser.error(f"--only: no such row {', '.join(sorted(unknown))}; the rows: {', '.join(c.name for c in CHECKS)}")
    host = probe(force_cpu=args.cpu)
    if args.plan:
        print(f"GPU check plan: {host.gpu or 'no GPU (CPU mode)'}")
        for check, skip in plan(host, only):
            print(f"| {check.name} | {check.title} | {skip or 'runs'} | {check.target} |")
        return 0
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the children, and the daemon's slots, see no GPU
    table = Table(args.out, args.budget_s, host)
    asyncio.run(run_checks(table, args, [check for check, skip in plan(host, only) if skip is None]))
    for check, skip in plan(host, only):
        if skip is not None and skip != "not asked (--only)":
            table.row(check.title, skip, target=check.target)
    table.row("check wall (s)", round(time.monotonic() - table.started, 1))
    print("\n" + table.markdown())
    return 1 if table.failed() else 0


if __name__ == "__main__":
    sys.exit(main())
