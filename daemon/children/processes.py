"""What a job needs of its child and of where children come from, as `Protocol`s: the seam a child run
elsewhere (a remote engine) fits as well as a process here.

A job hands its child a `ChildJob` (the spec the daemon wrote and the log its output goes to, its
devices, how many processes), learns where it runs as a `ChildHandle` (a pid only for a process on this
host), and follows it through the stream of its decoded messages (`on_message`), never a file
descriptor. Which kind of child a job gets (forked, warm, cold, torchrun's launcher) is the source's
choice (`ChildSource.start`), not the job's. `daemon/children/child.py`'s `Child` and
`daemon/children/warm.py`'s `WarmChildren` are the real ones; the test suite's `FakeChild` and `FakeChildren`
(tests/fakes.py) follow a script instead of training, so the scheduler, a job's lifecycle and its
supervision run in a unit test in milliseconds."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from daemon.children.child import ChildHandle, ChildJob, ChildOutcome, OnMessage

__all__ = ["ChildHandle", "ChildJob", "ChildSource", "JobProcess"]


class JobProcess(Protocol):
    """A started child waiting for its job. `stop(grace_s)` ends it (a stop at a checkpoint, killed after the
    grace), and `run` then returns with how it ended; a task awaiting `run` cancelled without a `stop` kills the
    child at once (the daemon itself is going down)."""

    log_context: dict[str, str]

    @property
    def handle(self) -> ChildHandle: ...

    async def run(
        self, job: ChildJob, on_start: Callable[[ChildHandle], Awaitable[None]], on_message: OnMessage
    ) -> ChildOutcome: ...

    async def stop(self, grace_s: float) -> None: ...


class ChildSource(Protocol):
    """Where a job's child comes from: `start` chooses for the job (here: a one-GPU job's child from a fork server,
    a warm child or a cold start; a job of several GPUs, torchrun's launcher started for it alone); `prepare`
    readies children ahead for the devices likely wanted next."""

    async def prepare(self, wanted: list[str | None]) -> None: ...
    async def start(self, job: ChildJob) -> JobProcess: ...
    async def close(self) -> None: ...
