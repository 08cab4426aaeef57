"""The child process's entry point: `python -m handlers.runner`.

Imports the training stack, says `ready` on the status pipe (fd in ADAPTERD_STATUS_FD), then reads
one job from stdin: a JSON line `{"spec": path, "log": path}`. Its stdout and stderr go to the
daemon, which writes them to the job's log and to its own log. It runs the job and exits: 0 after a
`result` line, 1 after an `error` line, 75 after stopping at a checkpoint on SIGTERM; anything else
(a signal, an out-of-memory kill) means it died before it could say why.
Importing before the job arrives is what makes a warm child warm; CUDA is not touched until the job.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from pathlib import Path

from daemon.errors import JobFailed
from daemon.job_spec import JobSpec

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process when the daemon dies, so no trainer outlives it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(os.environ.get("ADAPTERD_PARENT_PID", os.getppid())):
        os._exit(1)  # the parent died before prctl took effect


def main() -> int:
    die_with_parent()

    from handlers import HANDLERS
    from handlers.common import EXIT_STOPPED, StatusReporter
    from schemas.request import REQUEST_MODELS

    reporter = StatusReporter(int(os.environ["ADAPTERD_STATUS_FD"]))
    reporter.send("ready")
    line = sys.stdin.readline()
    if not line:
        return 0  # the daemon closed the pipe: this warm child is not needed
    job = json.loads(line)
    reporter.restart_clock()
    print(f"adapterd child {os.getpid()}: job {job['spec']}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '(unset)')}", flush=True)

    def stop(signum: int, frame: object) -> None:
        # While training, stop at a fresh checkpoint (JobCallback); before that there is nothing to keep.
        if reporter.stage == "train":
            reporter.stop_requested = True
        else:
            raise SystemExit(EXIT_STOPPED)

    signal.signal(signal.SIGTERM, stop)

    spec = JobSpec.model_validate_json(Path(job["spec"]).read_text())
    request = REQUEST_MODELS[str(spec.request["method"])].model_validate(spec.request)
    try:
        result = HANDLERS[request.method].train(request, spec, reporter)
    except JobFailed as failure:
        reporter.error(failure)
        return 1
    except Exception as exc:
        reporter.error(JobFailed("training_error", reporter.stage, f"{type(exc).__name__}: {exc}"))
        raise
    reporter.result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
