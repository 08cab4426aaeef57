"""What a job needs of its child and of where children come from, as `Protocol`s: the seam a child run
elsewhere (a remote engine) fits as well as a process here.

A job hands its child's source a `ChildJob` (the spec as a value, its devices, how many processes: what a
source elsewhere could ship), and gets back a `ChildHandle`, the running child's handle: it names where
the child runs (`ChildPlace`, a pid only for a process on this host, and where its log is), gives the
stream of its decoded messages (`messages`, never a file descriptor), stops it (`stop`) and says how it
ended (`wait`). Which kind of child a job gets (forked, warm, cold, torchrun's launcher) and where its spec
and log are written is the source's choice (`ChildSource.start`), not the job's.
`daemon/children/child.py`'s `Child` and `daemon/children/warm.py`'s `WarmChildren` are the real ones;
the test suite's `FakeChild` and `FakeChildren` (tests/fakes.py) follow a script instead of training, and
tests/daemon/core/test_child_seam.py's source runs its children nowhere at all, so the scheduler, a job's
lifecycle and its supervision run in a unit test in milliseconds."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from daemon.children.child import ChildExit, ChildJob, ChildPlace
from handlers.protocol import ChildMessage

__all__ = ["ChildExit", "ChildPlace", "ChildJob", "ChildSource", "ChildHandle"]


class ChildHandle(Protocol):
    """A child running its job, as its supervisor follows it: `messages` from its start to its end (a read of them
    cancelled loses none, so what a stopped child says while stopping is read after; ValueError for a message too
    long to read whole), `stop(grace_s)` to end it (a stop at a checkpoint, killed after the grace; at once for 0),
    and `wait` for how it ended once its messages have."""

    @property
    def place(self) -> ChildPlace: ...

    def messages(self) -> AsyncIterator[ChildMessage]: ...

    async def stop(self, grace_s: float) -> None: ...

    async def wait(self) -> ChildExit: ...


class ChildSource(Protocol):
    """Where a job's child comes from: `start` chooses for the job and hands it its job (here: a one-GPU job's child
    from a fork server, a warm child or a cold start; a job of several GPUs, torchrun's launcher started for it
    alone); `prepare` readies children ahead for the devices likely wanted next."""

    async def prepare(self, wanted: list[str | None]) -> None: ...
    async def start(self, job: ChildJob) -> ChildHandle: ...
    async def close(self) -> None: ...
