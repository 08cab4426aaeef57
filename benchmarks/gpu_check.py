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
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).with_name("results")
BENCH = "gpu check"

# The shape of Qwen2.5-0.5B (about 494M parameters with tied embeddings).
QWEN2_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}


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


# --- what the GPU rows train on ------------------------------------------------------------------


def build_qwen2_05b(out_dir: Path) -> Path:
    """A Qwen2 model of Qwen2.5-0.5B's shape, random weights, saved in bf16 with the tiny model's
    tokenizer padded to the vocabulary. Runs in a child interpreter (`--build-model`)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from handlers.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    # Pad the tiny tokenizer to Qwen's 151,936 ids, so every id the model can produce decodes (vLLM
    # samples from all of them; random weights make most of its picks these padding tokens).
    tokenizer.add_tokens([f"<|pad{i}|>" for i in range(QWEN2_05B["vocab_size"] - len(tokenizer))])
    torch.manual_seed(0)
    config = Qwen2Config(**QWEN2_05B, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def long_rows(count: int = 64) -> list[dict[str, Any]]:
    """Chat rows of a few hundred tokens each, so a step of the 0.5B model is GPU work, not overhead."""
    from handlers.tiny_model import CORPUS

    rows = []
    for index in range(count):
        text = " ".join(CORPUS[(index + k) % len(CORPUS)] for k in range(12))
        rows.append({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]})
    return rows


def tokens_per_row(model_dir: Path, rows: list[dict[str, Any]]) -> float:
    """Mean tokens of a row as SFT sees it (the chat template applied): samples/s times this is tokens/s."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [len(tokenizer(tokenizer.apply_chat_template(row["messages"], tokenize=False))["input_ids"]) for row in rows]
    return sum(lengths) / len(lengths)


def sft_request(model_dir: Path, request_id: str, steps: int, rows: list[dict[str, Any]], *, quantization: str = "none") -> dict[str, Any]:
    model: dict[str, Any] = {"id": str(model_dir), "dtype": "bfloat16"}
    if quantization != "none":
        model["quantization"] = quantization
    return {
        "schema_version": 1,
        "request_id": request_id,
        "method": "sft",
        "model": model,
        "dataset": {"rows": rows},
        "peft": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear", "use_rslora": False, "use_dora": False},
        "training": {"max_steps": steps, "learning_rate": 1e-4, "per_device_train_batch_size": 8, "bf16": True},
        "output": {"repo_id": f"bench/{request_id}"},
    }


def grpo_request(model_dir: Path, request_id: str, steps: int) -> dict[str, Any]:
    from daemon.cli.demo_requests import PROMPT_ROWS

    example = json.loads((Path(__file__).parents[1] / "schemas" / "examples" / "grpo.json").read_text())
    return {
        **example,
        "request_id": request_id,
        "model": {"id": str(model_dir), "dtype": "bfloat16"},
        "dataset": {"rows": PROMPT_ROWS * 4},
        "peft": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
        "grpo": {
            "num_generations": 4, "max_completion_length": 32, "beta": 0.0,
            "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3, "vllm_max_model_length": 512,
        },
        "training": {"max_steps": steps, "learning_rate": 1e-5, "per_device_train_batch_size": 4, "bf16": True},
        "output": {"repo_id": f"bench/{request_id}"},
    }


# --- reading the GPU and a child from outside ---------------------------------------------------


def gpu_used_mib() -> float:
    """Memory used on the job's GPUs (all visible ones), as nvidia-smi reports it."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], check=True, capture_output=True, text=True).stdout
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    used = [float(line) for line in out.split()]
    if visible:
        used = [used[int(i)] for i in visible.split(",") if i.strip().isdigit() and int(i) < len(used)]
    return sum(used)


def gpu_compute_pids() -> set[int]:
    if shutil.which("nvidia-smi") is None:
        return set()
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    return {int(line) for line in out.split() if line.isdigit()}


def cuda_state(pid: int) -> dict[str, Any]:
    """What a child shows of CUDA from outside: an open /dev/nvidia* file (the driver opened: CUDA or
    NVML initialised), libcuda mapped, a CUDA context (nvidia-smi's compute processes), torch mapped."""
    fds = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            fds += os.readlink(fd).startswith("/dev/nvidia")
        except OSError:
            continue
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {"nvidia_fds": fds, "libcuda": "libcuda.so" in maps, "context": pid in gpu_compute_pids(), "torch": "libtorch" in maps}


def untouched(state: dict[str, Any]) -> bool:
    return state["nvidia_fds"] == 0 and not state["context"]


# --- the checks -------------------------------------------------------------------------------


async def sft_rows(env: Any, request: dict[str, Any], steps: int, repeats: int, tokens: float, model: str) -> list[Any]:
    """Daemon against plain TRL, the same request, alternating; benchmarks.overhead's runs."""
    from statistics import median

    from benchmarks import overhead
    from benchmarks.harness import Row

    plain, daemon = [], []
    for index in range(repeats):
        plain.append(overhead.plain_run(env, steps, {**request, "request_id": "plain"}))
        daemon.append(await overhead.daemon_run(env, steps, index, request))
    plain_tput = median(t for _, t in plain) * tokens
    daemon_tput = median(d["throughput"] for d in daemon) * tokens
    note = f"{model}, {steps} steps, {repeats} alternating run(s) each; samples/s x {tokens:.0f} tokens a row"
    return [
        Row(BENCH, "SFT LoRA: plain TRL tokens/s", round(plain_tput, 1), "tokens/s", note=note),
        Row(BENCH, "SFT LoRA: daemon tokens/s", round(daemon_tput, 1), "tokens/s",
            note=f"wall {median(d['wall'] for d in daemon):.1f} s submission to succeeded (plain: {median(w for w, _ in plain):.1f} s process)"),
        Row(BENCH, "SFT LoRA: tokens/s ratio daemon/plain", round(daemon_tput / plain_tput, 3), "", ">= 0.98"),
    ]


async def daemon_job(env: Any, request: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """One job through a daemon whose fork server is ready: the server's CUDA state before the job
    and after it (it must never touch CUDA), GPU memory before / peak during / after, the pid the job
    was forked from, and the `succeeded` event."""
    from benchmarks.harness import wait_for_log
    from schemas import Started, Succeeded
    from testbed.client import run_to_end

    settings = await env.settings(warm_child=True)
    daemon = env.daemon(settings)
    peak = 0.0
    done = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, await asyncio.to_thread(gpu_used_mib))
            await asyncio.sleep(0.2)

    def logged(event: str) -> list[dict[str, Any]]:
        return [line for line in daemon.log_lines() if line.get("event") == event]

    try:
        await wait_for_log(daemon, "forkserver.ready")
        warm_pid = logged("forkserver.starting")[-1]["pid"]
        before_state = cuda_state(warm_pid)
        before = gpu_used_mib() if cuda else None
        sampler = asyncio.create_task(sample()) if cuda else None
        started = time.monotonic()
        events = await run_to_end(settings, request)
        wall = time.monotonic() - started
        done.set()
        if sampler is not None:
            await sampler
        next_state = cuda_state(warm_pid)  # the server again, after forking the job: still without CUDA
        forked_from = {line["pid"]: line["server_pid"] for line in logged("child.forked")}
        after = None
        if cuda:
            await asyncio.sleep(1.0)  # nvidia-smi's figure trails the child's exit by a moment
            after = gpu_used_mib()
    finally:
        done.set()
        daemon.stop()
    final = events[-1]
    job_pid = next((e.pid for e in events if isinstance(e, Started)), None)
    return {
        "ok": isinstance(final, Succeeded), "final": final, "wall": wall, "warm_pid": warm_pid, "job_pid": job_pid,
        "forked_from": forked_from.get(job_pid),
        "before_state": before_state, "next_state": next_state, "before": before, "peak": peak, "after": after,
    }


def failure_text(result: dict[str, Any]) -> str:
    final = result["final"]
    return f"{final.type}: {getattr(final, 'code', '')} {getattr(final, 'message', '')}"[:200]


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
