"""In-memory stand-ins for the Kafka clients (daemon/kafka/clients.py's Protocols) and for the training
child (daemon/children/processes.py's), for unit tests of the daemon's core without a broker or torch:

- `FakeProducer` and `FakeConsumer`, Kafka in memory (testbed/memory_kafka.py, shared with the GPU check);
- `FakeChildren` hands each job a `FakeChild` that follows a `Script`: the messages a real child
  would send, then how it ends (an exit status, or hanging until it is stopped).

The end-to-end tests use the real parts; these show the logic above them in milliseconds."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from daemon.children.child import ChildExit, ChildHandle, ChildJob
from daemon.children.processes import ChildSource, JobProcess
from daemon.kafka.clients import Consumer, Producer
from daemon.kafka.records import Record
from handlers.protocol import ChildMessage, JobSpec
from testbed.memory_kafka import FakeBatch, FakeConsumer, FakeProducer, FakeRecord, Sent

__all__ = ["FakeBatch", "FakeChild", "FakeChildren", "FakeConsumer", "FakeProducer", "FakeRecord", "Script", "Sent"]


@dataclass
class Script:
    """What a `FakeChild` does with its job: send `messages` (as a child does over its status pipe),
    then exit with `returncode`, or, with `hang`, wait until it is stopped (a stall, a timeout, a
    cancel, a daemon stop). With `artifact` it first writes the job's artifact folder, as a child's
    save stage does, for the push to upload."""

    messages: list[ChildMessage] = field(default_factory=list)
    returncode: int = 0
    hang: bool = False
    artifact: bool = True


class FakeChild:
    _pids = itertools.count(40_000)

    def __init__(
        self,
        script: Script,
        job: ChildJob,
        hanging: asyncio.Event | None = None,
        by_request: dict[str, list[Script]] | None = None,
    ) -> None:
        self.visible_devices = job.visible_devices
        self.spec: JobSpec = job.spec  # the job as its source was handed it
        turns = (by_request or {}).get(job.request_id)
        if turns:  # this request's next script (its last repeats), whichever child it took
            script = turns.pop(0) if len(turns) > 1 else turns[0]
        self.script = script
        self.where = ChildHandle.local(
            next(self._pids)
        )  # a child elsewhere is named otherwise (tests/daemon/core/test_child_seam.py)
        self.stops: list[float] = []  # the grace of each `stop` it was given
        self.cancelled_unstopped = False  # a read of its messages was cancelled without a `stop` first
        self.hanging = hanging if hanging is not None else asyncio.Event()  # set once it waits to be stopped
        self._stopped = asyncio.Event()

    @property
    def handle(self) -> ChildHandle:
        return self.where

    @property
    def stopped_with(self) -> float | None:
        """The grace of its one stop, None if it was not stopped (and a test fails on a second)."""
        assert len(self.stops) <= 1, f"stopped {len(self.stops)} times: {self.stops}"
        return self.stops[0] if self.stops else None

    async def stop(self, grace_s: float) -> None:
        self.stops.append(grace_s)
        self._stopped.set()

    def messages(self) -> AsyncIterator[ChildMessage]:
        return self._follow_script()

    async def _follow_script(self) -> AsyncIterator[ChildMessage]:
        if self.script.artifact:
            self.spec.artifact.mkdir(parents=True, exist_ok=True)
            (self.spec.artifact / "adapter_config.json").write_text('{"peft_type": "LORA"}')
        for message in self.script.messages:
            yield message
        if self.script.hang:
            self.hanging.set()
            try:
                await self._stopped.wait()  # until it is stopped, as a training child runs until SIGTERM
            except asyncio.CancelledError:
                self.cancelled_unstopped = not self.stops
                raise

    async def wait(self) -> ChildExit:
        if self.script.hang:
            return ChildExit(-15 if self.stops[0] > 0 else -9)  # SIGTERM, or SIGKILL at once
        return ChildExit(self.script.returncode)


class FakeChildren:
    """Hands out a `FakeChild` per job, each following the next script (the last one repeats), or the
    scripts `by_request` names for its job's request, in turn. Jobs started together take their children in
    an order nobody fixes (each awaits a thread first), so a test that gives two of them different
    scripts names them by request."""

    def __init__(self, *scripts: Script, by_request: dict[str, list[Script]] | None = None) -> None:
        self.scripts = list(scripts)
        self.by_request = by_request or {}
        self.taken: list[FakeChild] = []
        self.hanging = asyncio.Event()  # set once any of its children waits to be stopped
        self.prepared: list[list[str | None]] = []
        self.launched: list[tuple[str | None, int]] = []  # (visible devices, GPUs) of each data-parallel launch
        self.closed = False

    async def prepare(self, wanted: list[str | None]) -> None:
        self.prepared.append(wanted)

    async def start(self, job: ChildJob) -> JobProcess:
        """The job's child, following the next script; a job of several GPUs (its launcher) noted in `launched`."""
        if job.gpus > 1:
            self.launched.append((job.visible_devices, job.gpus))
        script = self.scripts.pop(0) if len(self.scripts) > 1 else self.scripts[0]
        child = FakeChild(script, job, self.hanging, self.by_request)
        self.taken.append(child)
        return child

    async def close(self) -> None:
        self.closed = True


def _conforms(
    producer: FakeProducer,
    consumer: FakeConsumer,
    record: FakeRecord,
    child: FakeChild,
    children: FakeChildren,
) -> tuple[Producer, Consumer, Record, JobProcess, ChildSource]:
    """Never called: mypy (`.ci/run` checks this module) fails here when a fake stops being what the
    daemon's Protocols ask for."""
    return producer, consumer, record, child, children
