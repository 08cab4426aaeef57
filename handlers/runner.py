"""The child process's entry point: `python -m handlers.runner SPEC_JSON`.

Runs one job in a fresh interpreter and reports to the parent through the pipe whose fd is in
ADAPTERD_STATUS_FD. Exit status: 0 after a `result` line, 1 after an `error` line; anything else
(a signal, an out-of-memory kill) means the child died before it could say why.
"""

from __future__ import annotations

import ctypes
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


def main(spec_path: str) -> int:
    die_with_parent()
    spec = JobSpec.model_validate_json(Path(spec_path).read_text())

    # Heavy imports happen here, after the parent link is set up.
    from handlers import HANDLERS
    from handlers.common import JobPaths, StatusReporter
    from schemas.request import REQUEST_MODELS

    reporter = StatusReporter(int(os.environ["ADAPTERD_STATUS_FD"]))
    request = REQUEST_MODELS[str(spec.request["method"])].model_validate(spec.request)
    paths = JobPaths(checkpoints=spec.checkpoints, artifact=spec.artifact)
    try:
        result = HANDLERS[request.method].train(request, paths, reporter, spec.progress_interval_s)
    except JobFailed as failure:
        reporter.error(failure)
        return 1
    except Exception as exc:
        reporter.error(JobFailed("training_error", reporter.stage, f"{type(exc).__name__}: {exc}"))
        raise
    reporter.result(result)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
