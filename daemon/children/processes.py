"""What a job needs of its child process and of where children come from, as `Protocol`s:
`daemon/children/child.py`'s `Child` and `daemon/children/warm.py`'s `WarmChildren` are the real ones; the test
suite's `FakeChild` and `FakeChildren` (tests/fakes.py) follow a script instead of training, so
the scheduler, a job's lifecycle and its supervision run in a unit test in milliseconds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from daemon.children.child import ChildOutcome, OnMessage


class JobProcess(Protocol):
    """A started child waiting for its job. `stop(grace_s)` ends it (SIGTERM, SIGKILL after the
    grace), and `run` then returns with how it ended; a task awaiting `run` cancelled without a
    `stop` kills the child at once (the daemon itself is going down)."""

    log_context: dict[str, str]

    @property
    def pid(self) -> int: ...

    async def run(self, spec_path: Path, log_path: Path, on_start: Callable[[int], Awaitable[None]], on_message: OnMessage) -> ChildOutcome: ...

    async def stop(self, grace_s: float) -> None: ...


class ChildSource(Protocol):
    """Where a job's child comes from: a one-GPU job's from a fork server, a warm child or a cold start
    (`take`); a data-parallel job's launcher, started for it alone (`launch`)."""

    def environment(self, visible_devices: str | None) -> dict[str, str]: ...
    async def prepare(self, wanted: list[str | None]) -> None: ...
    async def take(self, visible_devices: str | None) -> JobProcess: ...
    async def launch(self, visible_devices: str | None, gpus: int, spec_path: Path, log_path: Path) -> JobProcess: ...
    async def close(self) -> None: ...
