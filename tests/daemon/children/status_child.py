"""A stand-in for `handlers.child.runner` that speaks its status pipe's protocol without the training stack, for
tests/daemon/children/test_child_stream.py: it says a stage before it is ready, then ready, reads its job on stdin,
prints it to its output, says it trains, and on SIGTERM says the checkpoint it stopped at and exits 75, as a
training child does."""

from __future__ import annotations

import json
import os
import signal
import sys


def main() -> None:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # taken by sigwait below, not by a handler
    status = os.fdopen(int(os.environ["ADAPTERD_STATUS_FD"]), "w", buffering=1)

    def say(**message: object) -> None:
        status.write(json.dumps(message) + "\n")

    say(kind="stage", stage="preflight")
    say(kind="ready")
    job = json.loads(sys.stdin.readline())
    with open(job["spec"]) as spec:
        print(f"status child: job {json.load(spec)['request']['request_id']}", flush=True)
    say(kind="stage", stage="train")
    signal.sigwait({signal.SIGTERM})
    say(kind="stopped", step=3, path="checkpoint-3")
    status.close()
    sys.exit(75)


if __name__ == "__main__":
    main()
