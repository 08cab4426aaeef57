"""The daemon's end of the fork server (`handlers.child.forkserver`): start it, ask it for a job's child,
learn when that child exits.

The server is started like any child (`Child.spawn`), with one end of a Unix socket pair; it
imports the training stack once and forks a child per job, so every job's child starts with its
imports done. A forked child is handed to `Child` as a spawned one is: its pid (a process group of
its own), its stdin, its stdout and stderr, its status pipe; its exit status comes from the server,
its parent, which reaps it. If the server dies, so do the children it forked (they die with their
parent): each is reported as killed by SIGKILL, and its job fails as a crash would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from collections.abc import Mapping
from pathlib import Path

import structlog

from daemon.children.child import OUTPUT_LIMIT, STATUS_LIMIT, Child, read_pipe
from daemon.errors import ForkServerGone

log = structlog.get_logger()

# What the server's environment holds so that it stays one thread (handlers/child/forkserver.py says why):
# no OpenMP workers from `import torch`, no jemalloc background thread from `import pyarrow`.
SERVER_ONLY = {"OMP_NUM_THREADS": "1", "JE_ARROW_MALLOC_CONF": "background_thread:false"}


def server_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The fork server's environment: `env` with `SERVER_ONLY` held, and the values `env` had for them
    (None: unset) in ADAPTERD_CHILD_ENV, which the server gives back to each child it forks."""
    held = dict(SERVER_ONLY)
    if env.get("JE_ARROW_MALLOC_CONF"):  # the operator's own jemalloc settings, with the thread still off
        held["JE_ARROW_MALLOC_CONF"] = f"{env['JE_ARROW_MALLOC_CONF']},background_thread:false"
    return {**env, **held, "ADAPTERD_CHILD_ENV": json.dumps({name: env.get(name) for name in SERVER_ONLY})}


class PipeWriter:
    """A child's stdin: the daemon writes one line (the job) and closes it. The line is small and
    the pipe fresh, so the write never blocks."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view) :]

    async def drain(self) -> None:
        return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ForkedProcess:
    """A child forked by the server, with what `Child` uses of an `asyncio.subprocess.Process`."""

    def __init__(self, pid: int, stdin: PipeWriter, stdout: asyncio.StreamReader, exited: asyncio.Future[int]) -> None:
        self.pid = pid
        self.stdin = stdin
        self.stdout = stdout
        self._exited = exited

    @property
    def returncode(self) -> int | None:
        return self._exited.result() if self._exited.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self._exited)


class ForkServer:
    """One running fork server and the children it has forked and not yet reaped."""

    def __init__(self, server: Child, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self._lock = asyncio.Lock()  # one fork request at a time: its answer is the next `forked`
        self._forked: asyncio.Future[int] | None = None
        self._exits: dict[int, asyncio.Future[int]] = {}
        self._reader = asyncio.create_task(self._read_answers())

    @classmethod
    async def start(cls, env: Mapping[str, str], log_path: Path) -> ForkServer:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            server = await Child.spawn(
                {**server_environment(env), "ADAPTERD_FORK_FD": str(theirs.fileno())},
                log_path,
                entry=("handlers.child.forkserver",),
                pass_fds=(theirs.fileno(),),
            )
        finally:
            theirs.close()
        ours.setblocking(False)
        log.info("forkserver.starting", pid=server.process.pid)
        return cls(server, ours)

    @property
    def alive(self) -> bool:
        return self.server.process.returncode is None and not self._reader.done()

    async def fork(self, env: Mapping[str, str], log_path: Path) -> Child:
        """A new child for one job, forked once the server is ready; `env`: variables it sets (CUDA_VISIBLE_DEVICES).
        Raises ForkServerGone (a ConnectionError) if the server is gone."""
        if not await self.server.ready_task:
            raise ForkServerGone("the fork server exited before it was ready")
        stdin_r, stdin_w = os.pipe()
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            async with self._lock:
                if not self.alive:
                    raise ForkServerGone("the fork server is not running")
                self._forked = asyncio.get_running_loop().create_future()
                socket.send_fds(self.sock, [json.dumps(dict(env)).encode()], [stdin_r, out_w, status_w])
                pid = await self._forked
        except BaseException:
            for fd in (stdin_w, out_r, status_r):
                os.close(fd)
            raise
        finally:
            for fd in (stdin_r, out_w, status_w):
                os.close(fd)
        stdout, _ = await read_pipe(out_r, OUTPUT_LIMIT)  # its transport closes itself at the end of the output
        status, transport = await read_pipe(status_r, STATUS_LIMIT)
        log.info("child.forked", pid=pid, server_pid=self.server.process.pid)
        return Child(ForkedProcess(pid, PipeWriter(stdin_w), stdout, self._exits[pid]), status, transport, log_path)  # type: ignore[arg-type]

    async def _read_answers(self) -> None:
        """Route the server's answers: `forked` to the fork waiting for it, `exited` to that child."""
        loop = asyncio.get_running_loop()
        try:
            while data := await loop.sock_recv(self.sock, 4096):
                answer = json.loads(data)
                if answer["kind"] == "forked":
                    self._exits[answer["pid"]] = loop.create_future()
                    if self._forked is not None and not self._forked.done():
                        self._forked.set_result(answer["pid"])
                elif answer["kind"] == "exited":
                    exited = self._exits.pop(answer["pid"], None)
                    if exited is not None and not exited.done():
                        exited.set_result(answer["returncode"])
        except OSError as exc:
            log.warning("forkserver.read_failed", error=repr(exc))
        finally:
            # The server is gone: the children it forked died with it (PR_SET_PDEATHSIG, SIGKILL).
            if self._forked is not None and not self._forked.done():
                self._forked.set_exception(ForkServerGone("the fork server exited"))
            for pid, exited in self._exits.items():
                if not exited.done():
                    exited.set_result(-signal.SIGKILL)
                    log.warning("forkserver.child_lost", pid=pid)
            self._exits.clear()

    async def close(self) -> None:
        """Stop the server: it exits when its socket closes (SIGTERM and SIGKILL after a grace)."""
        self._reader.cancel()
        await asyncio.gather(self._reader, return_exceptions=True)
        self.sock.close()
        await self.server.stop(grace_s=2.0)
