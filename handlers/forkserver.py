"""The fork server: `python -m handlers.forkserver`, the training stack imported once, a child forked per job.

It imports what `handlers.runner` imports, says `ready` on its status pipe (fd in
ADAPTERD_STATUS_FD), then serves the daemon on a Unix socket (fd in ADAPTERD_FORK_FD, one datagram
a message). A request is a JSON object of environment variables for the child (its
CUDA_VISIBLE_DEVICES) with three descriptors: the child's stdin, its stdout and stderr, its status
pipe. The server forks; the child is then what a spawned `handlers.runner` is after its imports: a
session of its own, killed when its parent dies, reading its job on stdin, one job and out. The
server answers `{"kind": "forked", "pid": …}`, and `{"kind": "exited", "pid": …, "returncode": …}`
(negative: the signal that killed it) once it has reaped that child. It exits when the daemon
closes the socket, and dies with the daemon.

Why a fork: every job starts with torch, transformers and TRL already imported (seconds on a GPU
host, more on a busy one), however many jobs run back to back. Why it stays safe: the server never
touches CUDA (checked before each fork), so every child's CUDA state is its own, made by its job;
and each job is still a process of its own that exits after it.

Why the server holds OpenMP at one thread: `import torch` runs a parallel region, which starts
libgomp's worker threads, and a fork keeps none of them while libgomp's state still counts them; a
child's first parallel region (its first CPU matmul) can then wait on them for ever (seen here: a
forked child stuck in libgomp under `dnnl::impl::parallel`). The daemon starts the server with
OMP_NUM_THREADS=1 (importing this package imports torch, so it must be set before the interpreter
starts), which leaves no workers to lose, and the environment's own value in
ADAPTERD_CHILD_OMP_NUM_THREADS. Each child gets that value back (or none) and the intra-op thread
count a fresh interpreter picks in that environment, probed once in a subprocess before the server
says ready (torch's default is MKL's count of physical cores, which nothing cheaper reproduces).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import selectors
import socket
import subprocess
import sys
import traceback
from collections.abc import MutableMapping

from handlers import runner

MAX_MESSAGE = 65536
THREADS_PROBE = "import torch; print(torch.get_num_threads())"


def main() -> int:
    runner.die_with_parent()

    # OMP_NUM_THREADS is 1 here (no libgomp workers to lose in a fork: the module docstring says why);
    # a child, and the probe of what a fresh interpreter picks, get the environment's own value.
    child_omp = os.environ.pop("ADAPTERD_CHILD_OMP_NUM_THREADS", None)
    probe_env = dict(os.environ)
    set_omp(probe_env, child_omp)
    probe = subprocess.Popen([sys.executable, "-c", THREADS_PROBE], stdout=subprocess.PIPE, text=True, env=probe_env)
    import torch

    from handlers import HANDLERS  # noqa: F401  # what runner.main imports: the reason this process exists
    from handlers.reporting import StatusReporter

    threads = int(probe.communicate()[0].strip())
    reporter = StatusReporter(runner.status_fd())
    server = socket.socket(fileno=int(os.environ["ADAPTERD_FORK_FD"]))
    # Objects made by the imports are never freed here; frozen, the collector leaves their pages
    # alone in the children, so those pages stay shared instead of being copied on a collection.
    gc.collect()
    gc.freeze()
    reporter.ready()
    print(f"adapterd fork server {os.getpid()}: ready; OpenMP held at {torch.get_num_threads()} thread here, "
          f"{threads} intra-op threads for each child", flush=True)

    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is None:  # a request from the daemon
                data, fds, _, _ = socket.recv_fds(server, MAX_MESSAGE, 3)
                if not data:
                    return 0  # the daemon closed its end: it is stopping
                if torch.cuda.is_initialized():  # never expected: a child would inherit a CUDA context it cannot use
                    print("adapterd fork server: CUDA was initialised in the server; exiting", flush=True)
                    return 1
                pid = fork_child(json.loads(data), fds, [server, reporter, selector], threads, child_omp)
                pidfd = os.pidfd_open(pid)
                selector.register(pidfd, selectors.EVENT_READ, pid)
                server.send(json.dumps({"kind": "forked", "pid": pid}).encode())
            else:  # a child has exited: reap it and say how
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(key.data, 0)
                server.send(json.dumps({"kind": "exited", "pid": key.data, "returncode": os.waitstatus_to_exitcode(status)}).encode())


def set_omp(env: MutableMapping[str, str], value: str | None) -> None:
    """OMP_NUM_THREADS in `env` as the environment had it before the server held it at one (None: unset)."""
    env.pop("OMP_NUM_THREADS", None)
    if value is not None:
        env["OMP_NUM_THREADS"] = value


def fork_child(env: dict[str, str], fds: list[int], server_side: list[object], threads: int, child_omp: str | None) -> int:
    """Fork one job child; in the parent, its pid. The child never returns: it runs its job and exits.
    The child gets `threads` intra-op threads and the environment's own OMP_NUM_THREADS (`child_omp`)."""
    stdin, output, status = fds
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        for fd in fds:
            os.close(fd)
        return pid
    code = 1
    try:
        for item in server_side:  # the server's socket, status pipe and selector are not the child's
            item.close()  # type: ignore[attr-defined]
        os.setsid()  # a process group of its own: a cancel kills the job and all it started
        os.dup2(stdin, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(stdin)
        os.close(output)
        set_omp(os.environ, child_omp)  # as the operator set it, for what the job starts
        import torch

        torch.set_num_threads(threads)  # new libgomp workers, started in this process
        print(f"adapterd job child {os.getpid()}: {torch.get_num_threads()} intra-op threads", flush=True)
        os.environ.update(env)
        os.environ["ADAPTERD_STATUS_FD"] = str(status)
        os.environ["ADAPTERD_PARENT_PID"] = str(os.getppid())
        code = runner.main()
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        # os._exit, not sys.exit: unwinding would run the server's frames in the child. What an
        # interpreter's exit would still do for the job is flush its output and its log handlers.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
