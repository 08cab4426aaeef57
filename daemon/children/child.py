"""One child process that runs one job, without ever importing torch here.

A child is a fresh interpreter running `handlers.child.runner`: it imports the training stack, says
`ready` on its status pipe, then reads one job (a JSON line) on stdin and runs it. Each child runs
one job and exits, so every job gets a clean process (`daemon.children.warm` starts them ahead of time).
Its status pipe carries `handlers.protocol` messages, decoded here and nowhere else.

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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import structlog
from pydantic import ValidationError

from handlers.protocol import (
    ChildError,
    ChildMessage,
    FirstStep,
    Ready,
    Refused,
    TrainResult,
    parse_child_message,
)

log = structlog.get_logger()

OnMessage = Callable[[ChildMessage], Awaitable[None]]


@dataclass(frozen=True)
class ChildJob:
    """One job as its child is given it: the spec the daemon wrote (the request, its data, where to save) and
    the log the child's output goes to; the devices it runs on and its processes, one per GPU."""

    spec_path: Path
    log_path: Path
    visible_devices: str | None
    gpus: int = 1


@dataclass(frozen=True)
class ChildHandle:
    """A started child as events and logs name it: `where` says where it runs ('pid 4242' for a process here; a
    child elsewhere, its engine's name for it), `pid` only for a process on this host (the `started` event's)."""

    where: str
    pid: int | None = None

    @classmethod
    def local(cls, pid: int) -> ChildHandle:
        return cls(f"pid {pid}", pid)


@dataclass
class ChildOutcome:
    """How a child's run ended: its exit status, its result or its own account of its failure.
    (Its stage is followed by its supervisor, from the same messages.)"""

    returncode: int
    result: TrainResult | None = None
    error: ChildError | None = None
    first_step_at: float | None = None
    log_tail: list[str] = field(default_factory=list)

    def describe_exit(self) -> str:
        if self.returncode < 0:
            return f"killed by {signal.Signals(-self.returncode).name}"
        return f"exit status {self.returncode}"


STATUS_LIMIT = 2**24  # the longest status line (a result with its metrics)
OUTPUT_LIMIT = 2**20  # the longest stdout line read whole; longer ones are read in pieces


async def read_pipe(fd: int, limit: int) -> tuple[asyncio.StreamReader, asyncio.BaseTransport]:
    """A stream over the read end of a pipe (it is closed with the transport)."""
    reader = asyncio.StreamReader(limit=limit)
    transport, _ = await asyncio.get_running_loop().connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb")
    )
    return reader, transport


def read_tail(path: Path, lines: int = 20) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return []


class Child:
    """One started child interpreter, waiting for its job."""

    def __init__(
        self,
        process: asyncio.subprocess.Process,
        reader: asyncio.StreamReader,
        transport: asyncio.BaseTransport,
        log_path: Path,
    ) -> None:
        self.process = process
        self.reader = reader
        self.transport = transport
        self._early: list[ChildMessage] = []
        # The child's stdout and stderr: written to `log_path` (the job's log once it has one) and
        # logged as `child.output` lines with the job's request id.
        self.log_path = log_path
        self.log_context: dict[str, str] = {}
        self.output_task: asyncio.Task[None] = asyncio.create_task(self._forward_output())
        # How long a stopped child may take to save a checkpoint before it is killed; 0 kills at once.
        # The only reader of the pipe until the child is ready; `run` reads it after this ends.
        self.ready_task: asyncio.Task[bool] = asyncio.create_task(self._read_until_ready())

    @property
    def handle(self) -> ChildHandle:
        return ChildHandle.local(self.process.pid)

    @classmethod
    async def spawn(
        cls,
        env: Mapping[str, str],
        log_path: Path,
        entry: tuple[str, ...] = ("handlers.child.runner",),
        pass_fds: tuple[int, ...] = (),
    ) -> Child:
        """Start `python -m <entry>`: `handlers.child.runner` for one process, `handlers.child.launch N` for N GPUs,
        `handlers.child.forkserver` for the fork server (`pass_fds`: its socket)."""
        read_fd, write_fd = os.pipe()
        child_env = {**env, "ADAPTERD_STATUS_FD": str(write_fd), "ADAPTERD_PARENT_PID": str(os.getpid())}
        log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                *entry,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                pass_fds=(write_fd, *pass_fds),
                env={**child_env, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
                limit=OUTPUT_LIMIT,
            )
        finally:
            os.close(write_fd)
        reader, transport = await read_pipe(read_fd, STATUS_LIMIT)
        return cls(process, reader, transport, log_path)

    async def _forward_output(self) -> None:
        assert self.process.stdout is not None
        # Kept open while the lines go to the same file (a trainer prints a line a step), reopened
        # when the job's log takes over; unbuffered, so the file is whole whenever it is read.
        log_file: BinaryIO | None = None
        opened: Path | None = None
        try:
            while True:
                try:
                    line = await self.process.stdout.readline()
                except ValueError:  # a line longer than the limit: take it in pieces
                    line = await self.process.stdout.read(OUTPUT_LIMIT)
                if not line:
                    return
                if log_file is None or opened != self.log_path:
                    if log_file is not None:
                        log_file.close()
                    log_file, opened = open(self.log_path, "ab", buffering=0), self.log_path  # closed below
                log_file.write(line)
                text = line.decode(errors="replace").rstrip()
                if text:
                    log.info("child.output", pid=self.process.pid, line=text, **self.log_context)
        finally:
            if log_file is not None:
                log_file.close()

    async def _messages(self) -> AsyncIterator[ChildMessage]:
        """The child's messages, decoded; a line that is not one is logged and skipped."""
        async for line in self.reader:
            try:
                yield parse_child_message(line)
            except ValidationError as exc:
                log.warning(
                    "child.bad_message", pid=self.process.pid, line=line[:200].decode(errors="replace"), error=str(exc)
                )

    @property
    def refusal(self) -> str | None:
        """Why a fork server refused to serve (it exits after saying so), or None."""
        return next((message.reason for message in self._early if isinstance(message, Refused)), None)

    async def _read_until_ready(self) -> bool:
        """True once the child has imported the training stack; False if it died first."""
        async for message in self._messages():
            if isinstance(message, Ready):
                return True
            self._early.append(message)
        return False

    async def run(
        self,
        job: ChildJob,
        on_start: Callable[[ChildHandle], Awaitable[None]],
        on_message: OnMessage,
    ) -> ChildOutcome:
        """Hand the child its job and follow it to its end, a `stop` included (SIGTERM: a training
        child saves a checkpoint and exits). Cancelling the awaiting task kills the child's whole
        process group at once. (A launcher was given its job as it started, and reads nothing here.)"""
        outcome = ChildOutcome(returncode=0)
        log_path = self.log_path = job.log_path
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(json.dumps({"spec": str(job.spec_path), "log": str(log_path)}).encode() + b"\n")
            await self.process.stdin.drain()
            self.process.stdin.close()
            await on_start(self.handle)
            await self.ready_task
            for message in self._early:
                await follow(message, outcome, on_message)
            async for message in self._messages():
                await follow(message, outcome, on_message)
            outcome.returncode = await self.process.wait()
            _signal_group(self.process.pid, signal.SIGKILL)  # whatever the trainer started and left behind
            await self._output_done()
        except BaseException:
            await self.stop(0)
            await self._drain(outcome, on_message)
            raise
        finally:
            self.transport.close()
        outcome.log_tail = read_tail(log_path)
        return outcome

    async def _output_done(self) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.output_task), 5)
        except TimeoutError:
            log.warning("child.output_open", pid=self.process.pid)  # a descendant still holds stdout open

    async def _drain(self, outcome: ChildOutcome, on_message: OnMessage) -> None:
        """After a stop: what the child said while stopping (the checkpoint it saved), now that it has exited."""
        if not self.ready_task.done() or self.ready_task.cancelled():
            return  # it was stopped before it was ready: it said nothing worth reading
        try:
            async with asyncio.timeout(5):
                async for message in self._messages():
                    await follow(message, outcome, on_message)
        except (TimeoutError, ValueError) as exc:
            log.warning("child.unread_messages", pid=self.process.pid, error=repr(exc))

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the child's process group, SIGKILL after `grace_s` (at once for 0); returns once
        it has exited and its output is all in its log."""
        process = self.process
        if process.returncode is None:
            _signal_group(process.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
            try:
                await asyncio.wait_for(asyncio.shield(process.wait()), grace_s)
            except TimeoutError:
                log.warning("child.kill", pid=process.pid, grace_s=grace_s)
                _signal_group(process.pid, signal.SIGKILL)
                await process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # whatever the trainer started and left behind
        self.ready_task.cancel()
        self.transport.close()
        # The process has exited, but its last lines (why it stopped) may still be in the pipe:
        # stop returns once they are in its log, so whoever reads the log next reads them.
        await self._output_done()


async def follow(message: ChildMessage, outcome: ChildOutcome, on_message: OnMessage) -> None:
    """Take one message of the child's into its outcome (its result, error, first step), then hand it on."""
    if isinstance(message, TrainResult):
        outcome.result = message
    elif isinstance(message, ChildError):
        outcome.error = message
    elif isinstance(message, FirstStep):
        outcome.first_step_at = message.time
    await on_message(message)


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
