"""Start a job's child process and follow what it reports, without ever importing torch here.

The child is a fresh interpreter running `handlers.runner`, in its own process group (so a cancel
or timeout kills everything it started), dying with the daemon (PR_SET_PDEATHSIG), and writing
JSON lines to a pipe of its own; its stdout and stderr go to a log file in the job's folder.
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


async def run_child(
    spec_path: Path,
    log_path: Path,
    env: Mapping[str, str],
    on_start: Callable[[int], Awaitable[None]],
    on_message: Callable[[Message], Awaitable[None]],
    stop_grace_s: float = 10.0,
) -> ChildOutcome:
    """Run one child to its end. Cancelling the awaiting task stops the child's whole process group:
    SIGTERM first, SIGKILL after `stop_grace_s`."""
    read_fd, write_fd = os.pipe()
    child_env = {**env, "ADAPTERD_STATUS_FD": str(write_fd), "ADAPTERD_PARENT_PID": str(os.getpid())}
    with log_path.open("ab") as log_file:
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "handlers.runner", str(spec_path),
                stdin=asyncio.subprocess.DEVNULL, stdout=log_file, stderr=asyncio.subprocess.STDOUT,
                pass_fds=(write_fd,), env=child_env, start_new_session=True,
            )
        finally:
            os.close(write_fd)
    outcome = ChildOutcome(returncode=0, stage="preflight")
    try:
        await on_start(process.pid)
        reader = asyncio.StreamReader(limit=2**24)
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(read_fd, "rb")
        )
        try:
            async for line in reader:
                message = json.loads(line)
                if message["kind"] == "stage":
                    outcome.stage = message["stage"]
                elif message["kind"] == "result":
                    outcome.result = message
                elif message["kind"] == "error":
                    outcome.error = message
                await on_message(message)
        finally:
            transport.close()
        outcome.returncode = await process.wait()
        _signal_group(process.pid, signal.SIGKILL)  # whatever the trainer started and left behind
    except BaseException:
        await stop_process_group(process, stop_grace_s)
        raise
    outcome.log_tail = read_tail(log_path)
    return outcome


async def stop_process_group(process: asyncio.subprocess.Process, grace_s: float) -> None:
    if process.returncode is not None:
        return
    _signal_group(process.pid, signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.shield(process.wait()), grace_s)
    except TimeoutError:
        log.warning("child.kill", pid=process.pid, grace_s=grace_s)
        _signal_group(process.pid, signal.SIGKILL)
        await process.wait()


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass
