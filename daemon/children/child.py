"""One child process that runs one job, without ever importing torch here.

A child is a fresh interpreter running `handlers.child.runner`: it imports the training stack, says
`ready` on its status pipe, then reads one job (a JSON line: its spec's path and its log's) on stdin
and runs it. Each child runs one job and exits, so every job gets a clean process
(`daemon.children.warm` starts them ahead of time). Its status pipe carries `handlers.protocol`
messages, decoded here and nowhere else, and handed on as a stream (`Child.messages`): the pipe is
this module's, never the supervisor's.

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
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import structlog
from pydantic import ValidationError

from daemon.ops.job_logs import LOG_NAME
from handlers.protocol import ChildMessage, JobSpec, Ready, Refused, parse_child_message

log = structlog.get_logger()

# In a job's folder on this host: the spec a local child reads (its output goes to LOG_NAME, the log the
# endpoint serves).
SPEC_NAME = "spec.json"


@dataclass(frozen=True)
class ChildJob:
    """One job as its child's source is handed it, a value a source elsewhere could ship: the spec (the request,
    its data, where to save), the devices it runs on, its processes (one per GPU), its attempt and its engine. Where
    its spec is written and its output goes is the source's business (`write_job` on this host); its handle says where
    the log is."""

    spec: JobSpec
    visible_devices: str | None
    gpus: int = 1
    attempt: int = 1  # which attempt of the request this is (a source elsewhere names its run by it)
    engine: Literal["local", "ray"] = "local"  # where it runs: this host, or the operator's Ray cluster
    hosts: int = 1  # the hosts its processes span (resources.hosts: on the Ray cluster, gpus / hosts on each)

    @property
    def request_id(self) -> str:
        return str(self.spec.request["request_id"])


@dataclass(frozen=True)
class LocalJob:
    """A job as a child on this host is given it: the paths of its spec, written by `write_job`, and of its log."""

    spec_path: Path
    log_path: Path

    def line(self) -> str:
        """The job as the child reads it, on its stdin or (a launcher's workers) in ADAPTERD_JOB."""
        return json.dumps({"spec": str(self.spec_path), "log": str(self.log_path)})


def write_job(job: ChildJob, folder: Path) -> LocalJob:
    """Write the job's spec into its folder on this host (`spec.json`; its log, `child.log`, beside it), where a
    local child reads it."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / SPEC_NAME
    spec_path.write_text(job.spec.model_dump_json(indent=2))
    return LocalJob(spec_path, folder / LOG_NAME)


@dataclass(frozen=True)
class ChildPlace:
    """A started child as events and logs name it: `where` says where it runs ('pid 4242' for a process here; a
    child elsewhere, its engine's name for it), `pid` only for a process on this host (the `started` event's), `log`
    where its output is (a file on this host; a child elsewhere, its engine's address for it)."""

    where: str
    pid: int | None = None
    log: str | None = None

    @classmethod
    def local(cls, pid: int, log: Path | None = None) -> ChildPlace:
        return cls(f"pid {pid}", pid, None if log is None else str(log))


@dataclass(frozen=True)
class ChildExit:
    """How a child ended: its exit status (negative: the signal that killed it) and its log's last lines."""

    returncode: int
    log_tail: list[str] = field(default_factory=list)

    def describe(self) -> str:
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
    """One started child interpreter: waiting for its job, then (`begin`) running it, followed through its
    `messages`, stopped with `stop`, ended with `wait`."""

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
        # The only reader of the pipe until the child is ready; `messages` reads it after this ends.
        self.ready_task: asyncio.Task[bool] = asyncio.create_task(self._read_until_ready())

    @property
    def place(self) -> ChildPlace:
        return ChildPlace.local(self.process.pid, self.log_path)

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
        while True:
            message = await self._next_message()
            if message is None:
                return
            yield message

    async def _next_message(self) -> ChildMessage | None:
        """The pipe's next message, decoded (a line that is not one is logged and skipped); None at its end. A read
        cancelled loses nothing: what the pipe held stays in the reader. ValueError for a line over STATUS_LIMIT."""
        while line := await self.reader.readline():
            try:
                return parse_child_message(line)
            except ValidationError as exc:
                log.warning(
                    "child.bad_message", pid=self.process.pid, line=line[:200].decode(errors="replace"), error=str(exc)
                )
        return None

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

    async def begin(self, job: LocalJob, request_id: str) -> None:
        """Hand the child its job: the paths of its spec and its log on its stdin (a launcher, given its job as it
        started, reads nothing there); its output goes to the job's log from now on. Killed at once if this is
        cancelled."""
        self.log_path = job.log_path
        self.log_context = {"request_id": request_id}
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(job.line().encode() + b"\n")
            await self.process.stdin.drain()
            self.process.stdin.close()
        except BaseException:
            await self.stop(0)
            raise

    def messages(self) -> ChildMessages:
        """What the child says about its job, decoded, from its start (what it said before it was ready included) to
        its status pipe's end."""
        return ChildMessages(self)

    async def wait(self) -> ChildExit:
        """Its exit, once its messages have ended: its status, and its log's last lines once its output is all in it."""
        try:
            returncode = await self.process.wait()
            _signal_group(self.process.pid, signal.SIGKILL)  # whatever the trainer started and left behind
            await self._output_done()
        finally:
            self.transport.close()
        return ChildExit(returncode, read_tail(self.log_path))

    async def _output_done(self) -> None:
        try:
            await asyncio.wait_for(asyncio.shield(self.output_task), 5)
        except TimeoutError:
            log.warning("child.output_open", pid=self.process.pid)  # a descendant still holds stdout open

    async def stop(self, grace_s: float) -> None:
        """SIGTERM to the child's process group, SIGKILL after `grace_s` (at once for 0); returns once
        it has exited and its output is all in its log. What it said while stopping (the checkpoint it
        saved) is still in `messages`."""
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


class ChildMessages:
    """A local child's messages as a stream: the messages it sent before it was ready, then its status pipe's, to
    its end. Not a generator, so that a read cancelled (a job stopped, the daemon going down) ends nothing: what the
    child says while it stops is read after, from the same stream. A child stopped before it was ready ends it: it
    said nothing worth reading."""

    def __init__(self, child: Child) -> None:
        self._child = child
        self._replayed = 0  # of the child's messages from before it was ready

    def __aiter__(self) -> ChildMessages:
        return self

    async def __anext__(self) -> ChildMessage:
        ready = self._child.ready_task
        if not ready.done():
            await asyncio.wait([ready])  # a read cancelled here leaves it be; a `stop` cancels it
        if ready.cancelled():
            raise StopAsyncIteration
        early = self._child._early
        if self._replayed < len(early):
            self._replayed += 1
            return early[self._replayed - 1]
        message = await self._child._next_message()
        if message is None:
            raise StopAsyncIteration
        return message


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
