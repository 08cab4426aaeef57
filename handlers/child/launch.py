"""The entry point of a multi-GPU job: `python -m handlers.child.launch N`.

It is torchrun's agent (`torch.distributed.run`) starting N `handlers.child.runner` workers on this host,
one per GPU of the job (CUDA_VISIBLE_DEVICES): data-parallel, or sharded where the request's
`resources.shard` asks (handlers/toolkit/distributed/fsdp.py). On a host without GPUs the workers are CPU
processes (gloo), which is how the tests run a job of two GPUs. Like every child it dies with the
daemon, and its workers die with it. Stopping it (SIGTERM) stops its workers, which save a checkpoint.

The workers' output reaches the job's one log through the agent, each line marked with its rank
(`[rank1] ...`): torchrun's own `--tee`, which keeps a copy of each worker's streams in the job's folder
(`ranks/`) and echoes their lines, prefixed, on the agent's stdout and stderr, which are the job's log.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from handlers.child.runner import die_with_parent

# How each worker's line is marked in the job's log (torchrun substitutes the worker's global rank).
RANK_PREFIX = "[rank${rank}] "


def main() -> None:
    die_with_parent()
    from torch.distributed.run import main as torchrun

    workers = int(sys.argv[1])
    ranks = (
        Path(json.loads(os.environ["ADAPTERD_JOB"])["spec"]).parent / "ranks"
    )  # the job's folder (daemon/children/warm.py `launch`)
    os.environ["PYTHONUNBUFFERED"] = "1"  # a worker's lines reach the log as it writes them, not when its buffer fills
    torchrun(
        [
            "--standalone",
            f"--nproc-per-node={workers}",
            "--tee=3",
            f"--log-dir={ranks}",
            f"--log-line-prefix-template={RANK_PREFIX}",
            "-m",
            "handlers.child.runner",
        ]
    )


if __name__ == "__main__":
    main()
