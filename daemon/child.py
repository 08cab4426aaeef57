"""Child processes that run jobs, without ever importing torch here.

A child is a fresh interpreter running `handlers.runner`: it imports the training stack, says
`ready` on its status pipe, then reads one job (a JSON line) on stdin and runs it. Started ahead of
time it is a *warm* child: the seconds spent importing torch and TRL are gone when a request
arrives. Each child runs one job and exits, so every job still gets a clean process.

Every child runs in its own process group (a cancel or timeout kills everything it started), dies
with the daemon (PR_SET_PDEATHSIG), and writes JSON lines to a pipe of its own; its stdout and
stderr go to a log file, the job's own once the job is handed over.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

log = structlog.get_logger()

Message = dict[str, Any]


@dataclass
class ChildOutcome:
    returncode: int
    stage: str
    result: Message | None = None
    error: Message | None = None
    first_step_at: float | None = None
    log_tail: list[str] = field(default_factory=list)

    def describe_exit(self) -> str:
        if self.returncode < 0:
            return f"killed by {signal.Signals(-self.returncode).name}"
        return f"exit status {self.returncode}"


def read_tail(path: Path, lines: int = 20) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return []


class Child:
    """One started child interpreter, waiting for its job."""

    def __init__(self, process: asyncio.subprocess.Process, reader: asyncio.StreamReader, transport: asyncio.BaseTransport) -> None:
        self.process = process
        self.reader = reader
        self.transport = transport
        self._early: list[Message] = []
        # The only reader of the pipe until the child is ready; `run` reads it after this ends.
        self.ready_task: asyncio.Task[bool] = asyncio.create_task(self._read_until_ready())

    @classmethod
    async def spawn(cls, env: Mapping[str, str], log_path: Path) -> Child:
        read_fd, write_fd = os.pipe()
        child_env = {**env, "ADAPTERD_STATUS_FD": str(write_fd), "ADAPTERD_PARENT_PID": str(os.getpid())}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with log_path.open("ab") as log_file:
            try:
                process = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "handlers.runner",
                    stdin=asyncio.subprocess.PIPE, stdout=log_file, stderr=asyncio.subprocess.STDOUT,
                    pass_fds=(write_fd,), env=child_env, start_new_session=True,
                )
            finally:
                os.close(write_fd)
        reader = asyncio.StreamReader(limit=2**24)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
        )
        return cls(process, reader, transport)

    async def _read_until_ready(self) -> bool:
        """True once the child has imported the training stack; False if it died first."""
        async for line in self.reader:
            message = json.loads(line)
            if message["kind"] == "ready":
                return True
            self._early.append(message)
        return False

    async def run(
        self,
        spec_path: Path,
        log_path: Path,
        on_start: Callable[[int], Awaitable[None]],
        on_message: Callable[[Message], Awaitable[None]],
        stop_grace_s: float = 10.0,
    ) -> ChildOutcome:
        """Hand the child its job and follow it to the end. Cancelling the awaiting task stops the
        child's whole process group: SIGTERM first, SIGKILL after `stop_grace_s`."""
        outcome = ChildOutcome(returncode=0, stage="preflight")
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"spec": str(spec_path), "log": str(log_path)}).encode() + b"\n")
            await self.process.stdin.drain()
            self.process.stdin.close()
            await on_start(self.process.pid)
            await self.ready_task
            for message in self._early:
                await self._follow(message, outcome, on_message)
            async for line in self.reader:
                await self._follow(json.loads(line), outcome, on_message)
            outcome.returncode = await self.process.wait()
            _signal_group(self.process.pid, signal.SIGKILL)  # whatever the trainer started and left behind
        except BaseException:
            await self.stop(stop_grace_s)
            raise
        finally:
            self.transport.close()
        outcome.log_tail = read_tail(log_path)
        return outcome

    @staticmethod
    async def _follow(message: Message, outcome: ChildOutcome, on_message: Callable[[Message], Awaitable[None]]) -> None:
        kind = message["kind"]
        if kind == "stage":
            outcome.stage = message["stage"]
        elif kind == "result":
            outcome.result = message
        elif kind == "error":
            outcome.error = message
        elif kind == "first_step":
            outcome.first_step_at = message["time"]
        await on_message(message)

    async def stop(self, grace_s: float = 10.0) -> None:
        process = self.process
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), grace_s)
            except TimeoutError:
                log.warning("child.kill", pid=process.pid, grace_s=grace_s)
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        self.ready_task.cancel()
        self.transport.close()


class WarmChildren:
    """Keeps one child started ahead of time, and replaces it after each job it takes."""

    def __init__(self, env: Mapping[str, str], log_path: Path, enabled: bool) -> None:
        self.env = env
        self.log_path = log_path
        self.enabled = enabled
        self._next: Child | None = None

    async def prepare(self) -> None:
        if self.enabled and self._next is None:
            child = self._next = await Child.spawn(self.env, self.log_path)
            log.info("child.warming", pid=child.process.pid)
            child.ready_task.add_done_callback(
                lambda task: log.info("child.warm_ready" if not task.cancelled() and task.result() else "child.warm_died", pid=child.process.pid)
            )

    async def take(self) -> Child:
        """The warm child if there is a live one (ready or still importing), else a new cold one."""
        child, self._next = self._next, None
        if child is not None and child.process.returncode is None:
            return child
        return await Child.spawn(self.env, self.log_path)

    async def close(self) -> None:
        if self._next is not None:
            await self._next.stop(grace_s=2.0)
            self._next = None


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
