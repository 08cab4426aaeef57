"""The child process's entry point: `python -m handlers.child.runner`.

Imports the training stack, says `ready` on the status pipe (fd in ADAPTERD_STATUS_FD), then reads
one job from stdin: a JSON line `{"spec": path, "log": path}`. Its stdout and stderr go to the
daemon, which writes them to the job's log and to its own log. It runs the job and exits: 0 after a
`result` line, 1 after an `error` line, 75 after stopping at a checkpoint on SIGTERM; anything else
(a signal, an out-of-memory kill) means it died before it could say why.
Importing before the job arrives is what makes a warm child warm; CUDA is not touched until the job.
What initialises CUDA at import (bitsandbytes) and what only some jobs use (the trackers) is imported
in name only (handlers/methods/), and only a job that needs it runs it (handlers/toolkit/deferred.py).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from handlers.protocol import JobFailed, JobSpec
from handlers.toolkit import deferred

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (the daemon; for a worker of a
    multi-GPU job, torchrun's agent, which dies with the daemon), so no trainer outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    parent = os.getppid() if is_torchrun_worker() else int(os.environ.get("ADAPTERD_PARENT_PID", os.getppid()))
    if os.getppid() != parent or os.getppid() == 1:
        os._exit(1)  # the parent died before prctl took effect


def is_torchrun_worker() -> bool:
    return "LOCAL_RANK" in os.environ


def status_fd() -> int:
    """Where this process reports to the daemon. A multi-GPU job's rank 0 reaches the daemon's pipe
    through the agent (torchrun closes inherited descriptors in its workers), a Ray job's through its actor;
    other ranks stay silent."""
    fd = int(os.environ["ADAPTERD_STATUS_FD"])
    if not is_torchrun_worker():
        return fd
    if (
        os.environ.get("ADAPTERD_RAY") == "1"
    ):  # a rank on Ray: its actor passed the pipe itself (handlers/child/ray_job.py)
        return fd if os.environ.get("RANK") == "0" else os.open(os.devnull, os.O_WRONLY)
    if os.environ.get("RANK") == "0":
        return os.open(f"/proc/{os.getppid()}/fd/{fd}", os.O_WRONLY)
    return os.open(os.devnull, os.O_WRONLY)


def main() -> int:
    die_with_parent()

    with deferred.deferring():  # all of the training stack's imports (handlers/methods/ defers only during its own)
        from handlers.methods import HANDLERS
        from handlers.toolkit.distributed.ranks import leave
        from handlers.toolkit.memory import out_of_memory
        from handlers.toolkit.reporting import EXIT_STOPPED, StatusReporter
        from schemas.request import REQUEST_MODELS

    reporter = StatusReporter(status_fd())
    reporter.ready()
    # A multi-GPU job's workers are started for their job (ADAPTERD_JOB); a warm child waits on stdin for one.
    line = os.environ.get("ADAPTERD_JOB") or sys.stdin.readline()
    if not line:
        return 0  # the daemon closed the pipe: this warm child is not needed
    job = json.loads(line)
    reporter.restart_clock()
    rank = f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}, " if is_torchrun_worker() else ""
    print(
        f"adapterd child {os.getpid()}: {rank}job {job['spec']}, "
        f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}",
        flush=True,
    )
    # What the job got of the daemon's environment (daemon/children/environment.py): names, never values.
    print(f"adapterd child {os.getpid()}: environment {' '.join(sorted(os.environ))}", flush=True)

    def stop(signum: int, frame: object) -> None:
        # While training, stop at a fresh checkpoint (JobCallback); before that there is nothing to keep.
        if reporter.stage == "train":
            reporter.stop_requested = True
        else:
            raise SystemExit(EXIT_STOPPED)

    signal.signal(signal.SIGTERM, stop)

    # A warm child starts wherever the daemon runs; the job runs in its own folder, so nothing in the
    # daemon's working directory (a folder named like a Hub dataset, say) is in reach of a relative path.
    spec_path = Path(job["spec"]).absolute()
    os.chdir(spec_path.parent)
    spec = JobSpec.model_validate_json(spec_path.read_text())
    if spec.traceparent is not None:  # the request's trace: in the job's log, and for any tracer in this process
        os.environ["TRACEPARENT"] = spec.traceparent
        print(f"adapterd child {os.getpid()}: traceparent {spec.traceparent}", flush=True)
    if spec.tensorboard_dir is not None:  # transformers' TensorBoardCallback writes where this says
        os.environ["TENSORBOARD_LOGGING_DIR"] = str(spec.tensorboard_dir / str(spec.request["request_id"]))
    request = REQUEST_MODELS[str(spec.request["method"])].model_validate(spec.request)
    absent = deferred.settle(deferred.needed_by(request))
    if absent:
        print(f"adapterd child {os.getpid()}: not needed by this job, left out: {', '.join(absent)}", flush=True)
    try:
        result = HANDLERS[request.method].train(request, spec, reporter)
    except JobFailed as failure:
        reporter.error(failure)
        return 1
    except Exception as exc:
        oom = out_of_memory(
            exc, reporter.stage, spec.memory_fraction
        )  # CUDA out of memory, in whichever stage it happened
        if oom is not None:
            reporter.error(oom)
            return 1
        reporter.error(JobFailed("training_error", reporter.stage, f"{type(exc).__name__}: {exc}"))
        raise
    reporter.send(result)
    leave()  # a job of several processes: its group ended on every rank before the workers exit
    return 0


if __name__ == "__main__":
    sys.exit(main())
