"""The entry point of a multi-GPU job: `python -m handlers.child.launch N`.

It is torchrun's agent (`torch.distributed.run`) starting N `handlers.child.runner` workers on this host,
one per GPU of the job (CUDA_VISIBLE_DEVICES): data-parallel, or sharded where the request's
`resources.shard` asks (handlers/toolkit/sharding.py). On a host without GPUs the workers are CPU
processes (gloo), which is how the tests run a job of two GPUs. Like every child it dies with the
daemon, and its workers die with it. Stopping it (SIGTERM) stops its workers, which save a checkpoint.
"""

from __future__ import annotations

import sys

from handlers.child.runner import die_with_parent


def main() -> None:
    die_with_parent()
    from torch.distributed.run import main as torchrun

    workers = int(sys.argv[1])
    torchrun(["--standalone", f"--nproc-per-node={workers}", "-m", "handlers.child.runner"])


if __name__ == "__main__":
    main()
