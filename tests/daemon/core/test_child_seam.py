"""The child seam (daemon/children/processes.py) with a child that is no process of this host's at all: a job run
by an engine elsewhere (a Ray cluster, say), as the daemon's handle on it sees it. The source is handed the job as a
value (its spec, not a file), the handle names the run and its log, streams what the engine relays, stops the run
when asked, and says how it ended; the daemon writes nothing for a local child and knows no pid. Milliseconds each,
on the in-memory fakes (tests/core.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from daemon.children.processes import ChildExit, ChildHandle, ChildJob, ChildPlace
from daemon.job.lifecycle import State
from daemon.jobs.offered import Offered, RunningJob
from daemon.settings import Settings
from handlers.protocol import ChildMessage, ProgressReport, StageEntered, StoppedAtCheckpoint
from schemas import Cancel
from tests.core import CoreOnFakes, turns_until
from tests.helpers import TRAIN_RESULT as RESULT
from tests.helpers import sft_request


class EngineRun:
    """One job's run on the engine, through the daemon's handle on it: what the engine relays arrives on a queue
    (`say`, `end`), a stop is asked of the engine (which relays the checkpoint the run saved on a stop with a grace),
    and its exit is the engine's word. No pid, no pipe, no file."""

    def __init__(self, job: ChildJob, number: int) -> None:
        self.job = job
        self._handle = ChildPlace(f"engine run-{number}", log=f"engine://runs/{number}/log")
        self._said: asyncio.Queue[ChildMessage | None] = asyncio.Queue()
        self.stops: list[float] = []
        self.returncode: int | None = None

    @property
    def place(self) -> ChildPlace:
        return self._handle

    def say(self, *messages: ChildMessage) -> None:
        for message in messages:
            self._said.put_nowait(message)

    def end(self, returncode: int) -> None:
        self.returncode = returncode
        self._said.put_nowait(None)

    def messages(self) -> EngineRun:
        return self

    def __aiter__(self) -> EngineRun:
        return self

    async def __anext__(self) -> ChildMessage:
        message = await self._said.get()  # a cancelled get takes nothing off the queue
        if message is None:
            raise StopAsyncIteration
        return message

    async def stop(self, grace_s: float) -> None:
        self.stops.append(grace_s)
        if self.returncode is None:
            if grace_s > 0:
                self.say(StoppedAtCheckpoint(step=7, path="engine://runs/checkpoint-7"))
            self.end(75 if grace_s > 0 else -9)

    async def wait(self) -> ChildExit:
        assert self.returncode is not None
        return ChildExit(self.returncode, [f"engine: run ended with {self.returncode}"])


class Engine:
    """A `ChildSource` whose children run on the engine: each job becomes a run there."""

    def __init__(self) -> None:
        self.runs: list[EngineRun] = []
        self.started = asyncio.Event()

    async def prepare(self, wanted: list[str | None]) -> None:
        return None

    async def start(self, job: ChildJob) -> ChildHandle:
        run = EngineRun(job, len(self.runs) + 1)
        self.runs.append(run)
        self.started.set()
        return run

    async def close(self) -> None:
        return None


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work", hub_token=None, progress_interval_s=0)


async def started_run(settings: Settings, request_id: str = "far") -> tuple[CoreOnFakes, EngineRun, RunningJob]:
    """`request_id`'s job, its run started on the engine and told it is training."""
    engine = Engine()
    core = CoreOnFakes(settings, children=engine)
    record = core.record(sft_request(request_id), 7)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    await asyncio.wait_for(engine.started.wait(), 5)
    [run] = engine.runs
    run.say(StageEntered(stage="train"))
    return core, run, core.scheduler.jobs[core.tp]


async def test_a_job_run_by_an_engine_elsewhere_trains_to_success_through_its_handle(settings: Settings) -> None:
    core, run, job = await started_run(settings)
    # The engine was handed the spec itself: the daemon wrote no spec file for a child of this host's to read.
    assert run.job.spec.request["request_id"] == "far" and run.job.gpus == 1
    assert not (settings.jobs_dir / "far" / "spec.json").exists()
    run.job.spec.artifact.mkdir(parents=True)  # what the engine saves comes back where the spec says
    (run.job.spec.artifact / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    run.say(ProgressReport(step=1, total_steps=1, loss=1.3), StageEntered(stage="save"), RESULT)
    run.end(0)
    await job.task
    assert core.types("far") == ["accepted", "started", "progress", "succeeded"] and run.stops == []
    started = core.events("far")[1]
    assert started["pid"] is None and started["child"] == "engine run-1", started
    assert core.consumer.commits == [(core.tp, 8)] and core.slots.busy == 0


async def test_a_cancelled_job_stops_its_run_elsewhere_at_once_through_its_handle(settings: Settings) -> None:
    core, run, job = await started_run(settings)
    await core.scheduler.cancel(Cancel(request_id="far", reason="operator asked"))
    await job.task
    assert run.stops == [0]  # asked of the engine, at once: a cancel wants no checkpoint
    assert job.runner.lifecycle.history == [State.QUEUED, State.TRAINING, State.CANCELLED]
    assert core.types("far") == ["accepted", "started", "cancelled"] and core.consumer.commits == [(core.tp, 8)]


async def test_a_daemon_stop_reads_the_checkpoint_a_run_elsewhere_saved_on_its_stop(settings: Settings) -> None:
    core, run, job = await started_run(settings)
    await core.scheduler.stop_jobs()
    assert run.stops == [settings.drain_timeout_s]  # the grace to save, asked of the engine
    assert job.runner.supervisor.stop_steps() == (7, None)  # what it relayed while stopping was read
    assert core.types("far") == ["accepted", "started"] and core.consumer.commits == []


async def test_a_job_whose_task_is_cancelled_without_a_stop_kills_its_run_elsewhere(settings: Settings) -> None:
    """The daemon going down: the task running the job is cancelled, no stop first; the run is killed through its
    handle rather than left running on the engine."""
    core, run, job = await started_run(settings)
    await turns_until(lambda: core.types("far") == ["accepted", "started"])
    job.task.cancel()
    await asyncio.gather(job.task, return_exceptions=True)
    assert run.stops == [0] and core.types("far") == ["accepted", "started"]
