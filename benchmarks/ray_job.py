"""`python -m benchmarks.ray_job`: a job of two workers on Ray against the same job on a local two-rank child, side by
side on this machine: arrival → first step, the steady step time and the per-step losses; prints a table and one
line, `RAY_JOB key=value ...`.

The Ray side is a real local Ray head (testbed/ray_cluster.py: one node, two CPUs, started once, its start time
printed apart and counted in no run), and each run the daemon's own way onto it: `RayChildSource.start` (a Ray job
submitted through the Jobs API, whose driver, handlers/child/ray_job.py, places a bundle of one CPU for each rank and
runs the child runner in an actor per rank), followed through its log to its end. The local side is the child the
daemon starts for a job of two GPUs (testbed/child_runs.py: torchrun's agent and a worker per rank,
`handlers.child.launch 2`), on CPU processes (gloo). Both run the same request: SFT LoRA of the tiny model, float32,
two ranks at 2 rows each. Every rank has one OpenMP thread, as torchrun gives its workers (and the Ray driver gives
its ranks). The runs alternate, Ray then local, `--repeats` times, so both sides share the machine's noise.

Per run: arrival → first step, from just before the job is handed over (`start`, or the launcher's spawn) to the
end of the first optimizer step as the job's `first_step` message stamps it, which is what the daemon reports as
`until_first_step` (Ray's side also says when that message was read from the Ray job's log: `ray_first_step_seen_s`);
and the step time, the job's own `median_step_s` (the first step's set-up left out). Each figure is the median over
the repeats with its spread [min, max]. `loss_max_rel_diff` compares the first Ray run's per-step losses with the
first local run's.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from daemon.children.child import ChildJob
from daemon.children.ray_jobs import RayChildSource
from daemon.settings.ray import RaySettings
from handlers.protocol import ChildError, FirstStep, JobSpec, ProgressReport, TrainResult
from testbed.child_runs import run_child
from testbed.data import CHAT_ROWS
from testbed.ray_cluster import RayCluster

WORKERS = 2
STOP_GRACE_S = 30.0
# What the ranks see on both sides beyond their own basics: no Hub (the model is a local folder), and torchrun's one
# OpenMP thread a worker (the Ray driver sets it for its ranks too; here it is said for the local launcher alike).
ENV = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def request(model: Path, request_id: str, steps: int) -> dict[str, Any]:
    """The tiny model's SFT LoRA on two GPUs (ranks): a global batch of 4, 2 a rank (tests/daemon/e2e/test_ray_e2e.py's
    `two_ranks`)."""
    return {
        "schema_version": 1,
        "request_id": request_id,
        "method": "sft",
        "model": {"id": str(model), "dtype": "float32"},
        "dataset": {"rows": CHAT_ROWS},
        "sft": {"max_length": 64},
        "peft": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        "training": {"max_steps": steps, "learning_rate": 1e-2, "per_device_train_batch_size": 2, "seed": 1},
        "resources": {"gpus": WORKERS},
        "output": {"repo_id": "bench/ray-job"},
    }


@dataclass
class Side:
    name: str
    first_step_s: list[float] = field(default_factory=list)  # each run's arrival → first step
    step_s: list[float] = field(default_factory=list)  # each run's median step time
    losses: list[float] = field(default_factory=list)  # the first run's loss per step
    seen_s: list[float] = field(default_factory=list)  # Ray: when the first_step message was read

    def add(self, first_step_s: float, step_s: float, losses: list[float]) -> None:
        self.first_step_s.append(first_step_s)
        self.step_s.append(step_s)
        self.losses = self.losses or losses


def spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


async def ray_run(
    cluster: RayCluster, shared: Path, model: Path, repeat: int, steps: int
) -> tuple[float, float, float, list[float]]:
    """One run on the cluster as the daemon starts it: (arrival → first step, when its message was read, median step
    time, per-step losses). A run that ends any other way than with a result raises,
    with its log's tail."""
    request_id = f"ray-job-ray-{repeat}"  # a submission id of its own each repeat
    folder = shared / request_id
    spec = JobSpec(
        request=request(model, request_id, steps),
        checkpoints=folder / "checkpoints",
        artifact=folder / "artifact",
        progress_interval_s=0,
    )
    settings = RaySettings(
        address=cluster.address, shared_dir=shared, worker_resources={"CPU": 1}, python=sys.executable
    )
    source = RayChildSource(settings, ENV, STOP_GRACE_S)
    arrival, arrival_clock = time.time(), time.monotonic()
    run = await source.start(ChildJob(spec, None, WORKERS, 1, "ray"))
    first_step = seen = step = None
    losses: list[float] = []
    async for message in run.messages():
        if isinstance(message, FirstStep) and first_step is None:
            first_step, seen = message.time - arrival, time.monotonic() - arrival_clock
        elif isinstance(message, ProgressReport) and message.loss is not None:
            losses.append(message.loss)
        elif isinstance(message, TrainResult):
            step = message.metrics.get("median_step_s")
        elif isinstance(message, ChildError):
            raise RuntimeError(f"the Ray run failed: {message.model_dump_json()}")
    end = await run.wait()
    if end.returncode != 0 or first_step is None or seen is None or step is None:
        raise RuntimeError(f"the Ray run {run.sid} ended {end.returncode} without a result: " + "\n".join(end.log_tail))
    return first_step, seen, step, losses


def local_run(root: Path, model: Path, repeat: int, steps: int) -> tuple[float, float, list[float]]:
    """One run of the local two-rank child as the daemon launches it: (arrival → first step, median step time,
    per-step losses)."""
    arrival = time.time()
    run = run_child(
        request(model, f"ray-job-local-{repeat}", steps), root / f"local-{repeat}", WORKERS, devices="", threads=1
    )
    result = run.result()
    first = next(message for message in run.messages if message["kind"] == "first_step")
    return first["time"] - arrival, result["metrics"]["median_step_s"], run.losses()


def loss_max_rel_diff(ray: list[float], local: list[float]) -> float:
    assert ray and len(ray) == len(local), (ray, local)
    return max(abs(r - m) / abs(m) for r, m in zip(ray, local, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of each side, alternating, for the spread")
    parser.add_argument("--steps", type=int, default=30, help="optimizer steps a job")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))  # the source's info
    from handlers.fixtures.tiny_model import save_tiny_model

    ray, local = Side("Ray, 2 workers"), Side("local, 2 ranks")
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        model = save_tiny_model(root / "tiny-model")
        cluster = RayCluster(root / "ray")
        began = time.monotonic()
        cluster.start()
        cluster_start_s = time.monotonic() - began
        try:
            print(
                f"tiny model, SFT LoRA, float32, {WORKERS} ranks at 2 rows each, {args.steps} steps, "
                f"{args.repeats} repeat(s) a side, alternating; one OpenMP thread a rank; "
                f"the local Ray head started in {cluster_start_s:.1f} s (counted in no run)",
                flush=True,
            )
            for repeat in range(args.repeats):
                first_step, seen, step, losses = asyncio.run(
                    ray_run(cluster, root / "shared", model, repeat, args.steps)
                )
                ray.add(first_step, step, losses)
                ray.seen_s.append(seen)
                local.add(*local_run(root, model, repeat, args.steps))
                print(
                    f"repeat {repeat + 1}: Ray first step {first_step:.2f} s (read {seen:.2f} s), step {step:.4f} s; "
                    f"local first step {local.first_step_s[-1]:.2f} s, step {local.step_s[-1]:.4f} s",
                    flush=True,
                )
        finally:
            cluster.stop()
    print("| job | arrival → first step s, median [min, max] | step s, median [min, max] |")
    print("|---|---|---|")
    for side in (ray, local):
        print(f"| {side.name} | {spread(side.first_step_s, 2)} | {spread(side.step_s, 4)} |")
    line = {
        "workers": WORKERS,
        "steps": args.steps,
        "repeats": args.repeats,
        "ray_first_step_s": round(statistics.median(ray.first_step_s), 3),
        "local_first_step_s": round(statistics.median(local.first_step_s), 3),
        "ray_first_step_seen_s": round(statistics.median(ray.seen_s), 3),
        "ray_step_s": round(statistics.median(ray.step_s), 5),
        "local_step_s": round(statistics.median(local.step_s), 5),
        "loss_max_rel_diff": f"{loss_max_rel_diff(ray.losses, local.losses):.3g}",
        "cluster_start_s": round(cluster_start_s, 2),
    }
    print("RAY_JOB " + " ".join(f"{key}={value}" for key, value in line.items()), flush=True)


if __name__ == "__main__":
    main()
