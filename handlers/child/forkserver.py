"""The fork server: `python -m handlers.child.forkserver`, the training stack imported once, a child forked per job.

It imports what `handlers.child.runner` imports, says `ready` on its status pipe (fd in
ADAPTERD_STATUS_FD), then serves the daemon on a Unix socket (fd in ADAPTERD_FORK_FD, one datagram
a message). A request is a JSON object of environment variables for the child (its
CUDA_VISIBLE_DEVICES) with three descriptors: the child's stdin, its stdout and stderr, its status
pipe. The server forks; the child is then what a spawned `handlers.child.runner` is after its imports: a
session of its own, killed when its parent dies, reading its job on stdin, one job and out. The
server answers `{"kind": "forked", "pid": …}`, and `{"kind": "exited", "pid": …, "returncode": …}`
(negative: the signal that killed it) once it has reaped that child. It exits when the daemon
closes the socket, and dies with the daemon.

Why a fork: every job starts with torch, transformers and TRL already imported (seconds on a GPU
host, more on a busy one), however many jobs run back to back; each job is still a process of its
own that exits after it, and its CUDA state is its own, made by its job.

Why a fork stays safe: a fork copies only the thread that calls it, so a lock another thread held
stays locked in the child for ever, and a CUDA context cannot cross it at all. So the server is one
thread that never touches CUDA, and says `ready` only after checking both of itself; otherwise it
says `refused` with the reason and exits, and the daemon starts its children without it:
- CUDA: modules that initialise CUDA when imported (bitsandbytes) are imported in name only and run
  in the child at first use (handlers/toolkit/deferred.py); the check looks for CUDA initialised in torch and
  for an open /dev/nvidia* file (the driver opened), and runs again before each fork.
- Threads: the daemon starts the server with OMP_NUM_THREADS=1 and JE_ARROW_MALLOC_CONF's
  background_thread off (`import torch` starts libgomp's workers, `import pyarrow` jemalloc's
  background thread; both must be set before the interpreter starts, since the server imports
  torch), and the environment's own values in ADAPTERD_CHILD_ENV. Each child gets those
  values back and the intra-op thread count a fresh interpreter picks in that environment, probed
  once in a subprocess before the server says ready (torch's default is MKL's count of physical
  cores, which nothing cheaper reproduces). A fork from a process of several threads would also
  make Python 3.12 warn ("This process is multi-threaded, use of fork() may lead to deadlocks").
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
import threading
import traceback
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from handlers.child import runner
from handlers.toolkit import deferred

MAX_MESSAGE = 65536
THREADS_PROBE = "import torch; print(torch.get_num_threads())"


def main() -> int:
    # First, before anything imports torch: modules that touch CUDA when imported are imported in
    # name only here (handlers/toolkit/deferred.py says why).
    deferred.defer_in_fork_server()
    runner.die_with_parent()

    # OMP_NUM_THREADS and jemalloc's background thread are held here (the module docstring says why);
    # a child, and the probe of what a fresh interpreter picks, get the environment's own values.
    child_env = json.loads(os.environ.pop("ADAPTERD_CHILD_ENV", "{}"))
    probe_env = dict(os.environ)
    restore(probe_env, child_env)
    probe_env.pop(deferred.FORK_SERVER_VARIABLE, None)
    probe = subprocess.Popen([sys.executable, "-c", THREADS_PROBE], stdout=subprocess.PIPE, text=True, env=probe_env)
    import torch

    from handlers.methods import HANDLERS  # noqa: F401  # what runner.main imports: the reason this process exists
    from handlers.toolkit.reporting import StatusReporter

    threads = int(probe.communicate()[0].strip())
    reporter = StatusReporter(runner.status_fd())
    server = socket.socket(fileno=int(os.environ[deferred.FORK_SERVER_VARIABLE]))
    # Objects made by the imports are never freed here; frozen, the collector leaves their pages
    # alone in the children, so those pages stay shared instead of being copied on a collection.
    gc.collect()
    gc.freeze()
    unfit = cuda_touched() or other_threads()
    if unfit is not None:
        print(f"adapterd fork server {os.getpid()}: refused: {unfit}", flush=True)
        reporter.refused(unfit)
        return 1
    # Said in its log before it says ready to the daemon: once ready, it may be stopped at any moment.
    print(
        f"adapterd fork server {os.getpid()}: ready; one thread, CUDA untouched, deferred to the children: "
        f"{', '.join(deferred.pending()) or 'nothing'}; OpenMP held at {torch.get_num_threads()} thread here, "
        f"{threads} intra-op threads for each child",
        flush=True,
    )
    reporter.ready()

    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ, None)
    while True:
        for key, _ in selector.select():
            if key.data is None:  # a request from the daemon
                data, fds, _, _ = socket.recv_fds(server, MAX_MESSAGE, 3)
                if not data:
                    return 0  # the daemon closed its end: it is stopping
                unfit = (
                    cuda_touched()
                )  # never expected after the check above: a child would inherit a CUDA state it cannot use
                if unfit is not None:
                    print(f"adapterd fork server: {unfit}; exiting", flush=True)
                    return 1
                pid = fork_child(json.loads(data), fds, [server, reporter, selector], threads, child_env)
                pidfd = os.pidfd_open(pid)
                selector.register(pidfd, selectors.EVENT_READ, pid)
                server.send(json.dumps({"kind": "forked", "pid": pid}).encode())
            else:  # a child has exited: reap it and say how
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(key.data, 0)
                server.send(
                    json.dumps(
                        {"kind": "exited", "pid": key.data, "returncode": os.waitstatus_to_exitcode(status)}
                    ).encode()
                )


def restore(env: MutableMapping[str, str], originals: Mapping[str, str | None]) -> None:
    """The variables the daemon held for the server, as the environment had them (None: unset)."""
    for name, value in originals.items():
        env.pop(name, None)
        if value is not None:
            env[name] = value


def cuda_touched() -> str | None:
    """Why this process can no longer fork a child that may use CUDA, or None: CUDA initialised in
    torch, or the NVIDIA driver opened (cuInit, or a library's device query, opens /dev/nvidia*)."""
    import torch

    if torch.cuda.is_initialized():
        return "CUDA was initialised in the server"
    opened = []
    for fd in Path("/proc/self/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("/dev/nvidia"):
            opened.append(target)
    return f"the NVIDIA driver was opened in the server ({', '.join(sorted(set(opened)))})" if opened else None


def other_threads() -> str | None:
    """Which threads besides this one run here (a fork keeps only the caller), or None."""
    python = {thread.native_id: thread.name for thread in threading.enumerate()}  # a Python thread by its own name
    names = []
    for task in Path("/proc/self/task").iterdir():
        if int(task.name) != threading.get_native_id():
            try:
                names.append(python.get(int(task.name)) or (task / "comm").read_text().strip())
            except OSError:
                continue  # it ended
    return f"{len(names)} other thread(s) run in the server: {', '.join(sorted(names))}" if names else None


def fork_child(
    env: dict[str, str], fds: list[int], server_side: list[object], threads: int, child_env: Mapping[str, str | None]
) -> int:
    """Fork one job child; in the parent, its pid. The child never returns: it runs its job and exits.
    The child gets `threads` intra-op threads and the environment's own values of what the server held (`child_env`)."""
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
        restore(os.environ, child_env)  # as the operator set it, for what the job starts
        os.environ.pop(deferred.FORK_SERVER_VARIABLE, None)
        deferred.stop_deferring()  # a module still deferred (bitsandbytes) runs here at its first use
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
