"""`python -m benchmarks.sharded`: a job of one process, two ranks data-parallel and two ranks sharded (FSDP2,
`resources.shard: fsdp`), side by side on the tiny model at the same global batch; prints a table and one line,
`SHARDED key=value ...`.

Each run is the job's child as the daemon starts it (testbed/child_runs.py: `handlers.child.runner`, or torchrun's
agent and a worker per rank, `handlers.child.launch 2`), on CPU processes (gloo) and, where the host has GPUs, on
them too. Per row: the median step time (the job's own `median_step_s`, the first step's set-up left out) and its
spread over the repeats; each rank's peak memory as the job reports it (`rank<r>_peak_bytes`: on the CPU its peak
resident set, the interpreter and libraries included; on a GPU torch's allocator peak); what each rank holds of the
parameters (`rank<r>_param_bytes`); and, on the CPU, once per row, the most each rank's allocator held
(testbed/allocator_peak.py, under torch's profiler: the figure a GPU's allocator peak is, which the resident set
is not). On the CPU every process has one OpenMP thread, as torchrun gives its workers (a one-process job left to
use every core would be measured against ranks held to one each). `loss_max_rel_diff` compares the sharded job's
per-step losses with the data-parallel job's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.child_runs import ChildRun, run_child
from testbed.data import CHAT_ROWS

GLOBAL_BATCH = 4
# (name, processes, resources.shard): the rows of each device.
JOBS = (("one process", 1, "none"), ("2 ranks data-parallel", 2, "none"), ("2 ranks sharded", 2, "fsdp"))
KIB, MIB = 2**10, 2**20


def request(model: Path, name: str, processes: int, shard: str, steps: int, run: int) -> dict[str, Any]:
    """A full fine-tune of the tiny model, float32, `GLOBAL_BATCH` rows a step however many processes share it."""
    return {
        "schema_version": 1,
        "request_id": f"sharded-{name.replace(' ', '-')}-{run}",
        "method": "sft",
        "model": {"id": str(model), "dtype": "float32"},
        "dataset": {"rows": CHAT_ROWS},
        "sft": {"max_length": 64},
        "peft": None,
        "training": {
            "max_steps": steps,
            "per_device_train_batch_size": GLOBAL_BATCH // processes,
            "learning_rate": 1e-3,
            "seed": 1,
        },
        "resources": {"gpus": processes, "shard": shard},
        "output": {"repo_id": "bench/sharded"},
    }


@dataclass
class Row:
    device: str
    name: str
    processes: int
    step_s: list[float]  # each repeat's median step time
    peaks: list[list[float]]  # each repeat's peak per rank (bytes)
    param_bytes: list[float]  # per rank
    losses: list[float]  # the first repeat's loss per step
    allocator: dict[int, int] | None = None  # per rank, from a profiled run (CPU only)

    def step(self) -> float:
        return statistics.median(self.step_s)

    def peak(self) -> float:
        """The largest rank's peak, median over the repeats."""
        return statistics.median(max(each) for each in self.peaks)


def figures(result: dict[str, Any], processes: int) -> tuple[float, list[float], list[float]]:
    metrics = result["metrics"]
    peaks = (
        [metrics[f"rank{r}_peak_bytes"] for r in range(processes)]
        if processes > 1
        else [float(result["memory"]["device_peak_bytes"])]
    )
    if (
        processes == 1 and result["memory"]["peak_allocated_bytes"] is not None
    ):  # on a GPU, the allocator's as the ranks report
        peaks = [float(result["memory"]["peak_allocated_bytes"])]
    return metrics["median_step_s"], peaks, [metrics[f"rank{r}_param_bytes"] for r in range(processes)]


def measure(
    root: Path, model: Path, device: str, name: str, processes: int, shard: str, args: argparse.Namespace
) -> Row:
    devices = "" if device == "cpu" else ",".join(str(index) for index in range(processes))
    row = Row(device, name, processes, [], [], [], [])
    for repeat in range(args.repeats):
        run = run_child(
            request(model, name, processes, shard, args.steps, repeat),
            root / f"{device}-{shard}-{processes}-{repeat}",
            processes,
            devices=devices,
            threads=1 if device == "cpu" else None,
        )
        step, peaks, held = figures(run.result(), processes)
        row.step_s.append(step)
        row.peaks.append(peaks)
        row.param_bytes, row.losses = held, row.losses or run.losses()
    if device == "cpu" and args.allocator:
        profiled: ChildRun = run_child(
            request(model, name, processes, shard, args.steps, 99),
            root / f"alloc-{shard}-{processes}",
            processes,
            allocator=True,
            threads=1,
        )
        profiled.result()
        row.allocator = profiled.allocator_peaks
    return row


def print_row(row: Row) -> None:
    spread = f"{min(row.step_s):.4f}-{max(row.step_s):.4f}"
    peaks = " / ".join(f"{statistics.median(each[r] for each in row.peaks) / MIB:.0f}" for r in range(row.processes))
    held = " / ".join(f"{b:,.0f}" for b in row.param_bytes)
    allocator = " / ".join(f"{row.allocator[r] / KIB:,.0f}" for r in sorted(row.allocator)) if row.allocator else "-"
    print(f"| {row.device} | {row.name} | {row.step():.4f} ({spread}) | {peaks} | {held} | {allocator} |", flush=True)


def loss_max_rel_diff(sharded: list[float], data_parallel: list[float]) -> float:
    assert sharded and len(sharded) == len(data_parallel), (sharded, data_parallel)
    return max(abs(s - d) / abs(d) for s, d in zip(sharded, data_parallel, strict=True))


def gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each job, for the spread of its step time")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps a job")
    parser.add_argument(
        "--no-allocator", dest="allocator", action="store_false", help="leave out the profiled run of each CPU row"
    )
    parser.add_argument(
        "--quick", action="store_true", help="one repeat of 3 steps, no profiled runs: the test's settings"
    )
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.steps, args.allocator = 1, 3, False
    from handlers.fixtures.tiny_model import save_tiny_model

    found = gpus()
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model = save_tiny_model(root / "tiny-model")
        print(
            f"tiny model, full fine-tune, float32, global batch {GLOBAL_BATCH} ({GLOBAL_BATCH // 2} a rank on "
            f"two), {args.steps} steps, {args.repeats} repeat(s); peak memory a rank: the job's "
            "rank<r>_peak_bytes (CPU: peak resident set)",
            flush=True,
        )
        print(
            "| device | job | step s, median (min-max) | peak MiB a rank | parameter bytes a rank | "
            "CPU allocator peak KiB a rank |"
        )
        print("|---|---|---|---|---|---|")
        rows: dict[tuple[str, str], Row] = {}
        for device in ("cpu", "cuda"):
            for name, processes, shard in JOBS:
                if device == "cuda" and found < processes:
                    print(
                        f"| cuda | {name} | skipped: {'no GPU on this host' if found == 0 else 'one GPU'} | | | |",
                        flush=True,
                    )
                    continue
                rows[device, name] = measure(root, model, device, name, processes, shard, args)
                print_row(rows[device, name])
    one, dp, sharded = (rows["cpu", name] for name, _, _ in JOBS)
    line = {
        "ranks": 2,
        "dp_param_bytes_per_rank": int(max(dp.param_bytes)),
        "sharded_param_bytes_per_rank": int(max(sharded.param_bytes)),
        "one_step_s": round(one.step(), 5),
        "dp_step_s": round(dp.step(), 5),
        "sharded_step_s": round(sharded.step(), 5),
        "dp_peak_bytes_per_rank": round(dp.peak()),
        "sharded_peak_bytes_per_rank": round(sharded.peak()),
        "loss_max_rel_diff": f"{loss_max_rel_diff(sharded.losses, dp.losses):.3g}",
        "repeats": args.repeats,
        "gpus": found,
    }
    if dp.allocator and sharded.allocator:
        line |= {
            "dp_allocator_peak_bytes_per_rank": max(dp.allocator.values()),
            "sharded_allocator_peak_bytes_per_rank": max(sharded.allocator.values()),
        }
    if ("cuda", JOBS[2][0]) in rows:
        gpu_dp, gpu_sharded = rows["cuda", JOBS[1][0]], rows["cuda", JOBS[2][0]]
        line |= {
            "gpu_dp_step_s": round(gpu_dp.step(), 5),
            "gpu_sharded_step_s": round(gpu_sharded.step(), 5),
            "gpu_sharded_peak_bytes_per_rank": round(gpu_sharded.peak()),
        }
    print("SHARDED " + " ".join(f"{key}={value}" for key, value in line.items()), flush=True)


if __name__ == "__main__":
    main()
