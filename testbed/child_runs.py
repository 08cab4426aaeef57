"""A job's child run as the daemon starts it (daemon/children/warm.py), without the daemon: one process
(`handlers.child.runner`) or, for a job of several GPUs, torchrun's agent and a worker per rank
(`handlers.child.launch N`), the job given in the environment; what it says on the status pipe, read to its end.
With `allocator`, each process runs under torch's profiler (testbed/allocator_peak.py) and the run also says the
most each rank's CPU allocator held. For benchmarks.sharded, benchmarks.ray_job and the tests that measure a job's
ranks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from handlers.protocol import JobSpec


@dataclass(frozen=True)
class ChildRun:
    returncode: int
    messages: list[dict[str, Any]]  # every line of the status pipe, in order
    allocator_peaks: dict[int, int]  # rank → the most its CPU allocator held (with `allocator`), else empty
    allocator_collectives: dict[
        int, int
    ]  # rank → of that peak, the collectives' backend's own copies (gloo's: not a GPU's)
    log: Path  # the child's log (its stdout and stderr; each worker's lines marked with its rank)

    def result(self) -> dict[str, Any]:
        """The `result` message; an AssertionError with the log's tail when the job did not end with one."""
        results = [message for message in self.messages if message["kind"] == "result"]
        assert self.returncode == 0 and len(results) == 1, self.log.read_text()[-4000:]
        return results[0]

    def losses(self) -> list[float]:
        """The loss of each progress report (every step, with the spec's progress interval 0)."""
        return [m["loss"] for m in self.messages if m["kind"] == "progress" and m.get("loss") is not None]


def command(processes: int, allocator: bool, work: Path) -> list[str]:
    entry = "testbed.allocator_peak" if allocator else "handlers.child.runner"
    if processes == 1:
        return [sys.executable, "-m", entry]
    if not allocator:
        return [sys.executable, "-m", "handlers.child.launch", str(processes)]
    # The daemon's launch (handlers/child/launch.py) with the profiled entry in place of the runner.
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={processes}",
        "--tee=3",
        f"--log-dir={work / 'ranks'}",
        "--log-line-prefix-template=[rank${rank}] ",
        "-m",
        entry,
    ]


def run_child(
    request: dict[str, Any],
    work: Path,
    processes: int = 1,
    *,
    allocator: bool = False,
    devices: str = "",
    threads: int | None = None,
    timeout_s: float = 900,
) -> ChildRun:
    """Run `request` in a fresh child in `work` (its spec, checkpoints, artifact and log there): `processes` 1, or a
    job of that many GPUs (`devices`, CUDA_VISIBLE_DEVICES: empty for CPU processes, gloo). `threads`: each process's
    OpenMP threads (OMP_NUM_THREADS; torchrun gives its workers 1 where it is unset)."""
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "spec.json"
    spec.write_text(
        JobSpec(
            request=request, checkpoints=work / "checkpoints", artifact=work / "artifact", progress_interval_s=0
        ).model_dump_json()
    )
    peaks = work / "allocator"
    peaks.mkdir(exist_ok=True)
    read, write = os.pipe()
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": devices,
        "ADAPTERD_STATUS_FD": str(write),
        "ADAPTERD_PARENT_PID": str(os.getpid()),
        "ADAPTERD_JOB": json.dumps({"spec": str(spec), "log": str(work / "child.log")}),
        "ADAPTERD_PEAK_DIR": str(peaks),
        **({"OMP_NUM_THREADS": str(threads)} if threads is not None else {}),
    }
    with open(work / "child.log", "ab") as log:
        process = subprocess.Popen(
            command(processes, allocator, work), env=env, pass_fds=(write,), stdout=log, stderr=subprocess.STDOUT
        )
    os.close(write)
    with os.fdopen(read) as pipe:
        messages = [json.loads(line) for line in pipe]
    returncode = process.wait(timeout=timeout_s)
    found = [
        json.loads(path.read_text())
        for path in sorted(peaks.glob("rank[0-9]*.json"))
        if not path.name.endswith(".trace.json")
    ]
    return ChildRun(
        returncode,
        messages,
        {each["rank"]: each["peak_bytes"] for each in found},
        {each["rank"]: each["collective_bytes"] for each in found},
        work / "child.log",
    )
