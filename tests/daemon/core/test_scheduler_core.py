"""The scheduler, a job's lifecycle and its supervision on the in-memory fakes (tests/core.py): every
terminal outcome, what is committed, dead-lettered or sent back for another attempt, and what
stopping does, with a scripted child instead of a trainer and no broker. Milliseconds each; the
end-to-end tests keep what needs the real parts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from daemon.children.processes import ChildHandle, ChildJob, ChildPlace
from daemon.job.lifecycle import State, Stop
from daemon.jobs.offered import Offered, RunningJob
from daemon.settings import Settings
from handlers.protocol import (
    CheckpointSaved,
    ChildError,
    ChildMessage,
    FirstStep,
    ProgressReport,
    StageEntered,
    StoppedAtCheckpoint,
    TrainResult,
)
from schemas import Cancel
from tests.core import CoreOnFakes, turns_until
from tests.fakes import FakeChild, FakeChildren, Script
from tests.helpers import sft_request

RESULT = TrainResult(
    trainer="trl.SFTTrainer/trl.SFTConfig",
    metrics={"train_loss": 1.5, "final_loss": 1.2},
    base_model_revision="a" * 40,
    dataset_fingerprint="f",
    durations_s={"train": 0.1},
    versions={"trl": "test"},
)
TRAINS = [
    StageEntered(stage="load_dataset"),
    StageEntered(stage="train"),
    FirstStep(time=time.time(), step=1),
    ProgressReport(step=1, total_steps=4, loss=1.3),
    StageEntered(stage="save"),
]
SUCCEEDS = Script(messages=[*TRAINS, RESULT])


def crash(stage: str = "train") -> Script:
    return Script(messages=[StageEntered(stage=stage)], returncode=-9, artifact=False)  # type: ignore[arg-type]


def fails(code: str, retryable: bool) -> Script:
    return Script(
        messages=[
            StageEntered(stage="train"),
            ChildError(code=code, stage="train", message="it broke", retryable=retryable),
        ],  # type: ignore[arg-type]
        returncode=1,
        artifact=False,
    )


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # No Hub token: the push goes to the local sink under work_dir, as on a host without one.
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        max_attempts=2,
        retry_backoff_s=30,
        progress_interval_s=0,
    )


async def run_one(core: CoreOnFakes, request_id: str = "r1", offset: int = 7, **overrides: object) -> list[State]:
    """Offer one request as intake would, wait for its job to end, and say the states it went through."""
    record = core.record(sft_request(request_id, **overrides), offset)
    offered = await core.scheduler.offer(core.tp, record, core.request(record))
    assert offered is Offered.STARTED and core.tp in core.scheduler.jobs  # its partition is held while it runs
    job = core.scheduler.jobs[core.tp]
    await job.task
    return job.runner.lifecycle.history


async def test_success_publishes_each_step_then_commits_and_frees_the_slot(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(SUCCEEDS))
    assert await run_one(core) == [State.QUEUED, State.TRAINING, State.PUSHING, State.SUCCEEDED]
    assert core.types("r1") == ["accepted", "started", "progress", "succeeded"]
    succeeded = core.events("r1")[-1]
    assert succeeded["sink"] == "local" and succeeded["metrics"] == {"train_loss": 1.5, "final_loss": 1.2}
    assert Path(str(succeeded["location"]), "adapter_config.json").is_file()  # the artifact was pushed
    assert core.consumer.commits == [(core.tp, 8)]
    assert core.slots.busy == 0 and core.scheduler.jobs == {} and core.tp not in core.consumer.paused
    assert not core.dead_letters() and not core.requeued()


async def test_a_two_gpu_job_is_launched_data_parallel_through_the_child_source(settings: Settings) -> None:
    """A job of several GPUs goes through the same seam as a one-GPU job (`ChildSource.start`, not a spawn of its
    own), so its whole lifecycle runs on the fakes: both GPUs given to its one launch, the slot freed after."""
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings.model_copy(update={"gpus": ["0", "1"]}), children=children)
    assert await run_one(core, resources={"gpus": 2}) == [State.QUEUED, State.TRAINING, State.PUSHING, State.SUCCEEDED]
    assert children.launched == [("0,1", 2)] and [child.visible_devices for child in children.taken] == ["0,1"]
    assert core.slots.busy == 0 and core.consumer.commits == [(core.tp, 8)]


async def test_a_redelivered_success_is_answered_from_the_journal_without_training(settings: Settings) -> None:
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    await run_one(core)
    assert await run_one(core) == [State.QUEUED, State.SUCCEEDED]  # the same request again (its commit was lost)
    assert len(children.taken) == 1
    assert core.types("r1") == ["accepted", "started", "progress", "succeeded", "accepted", "succeeded"]
    assert core.events("r1")[-1]["duplicate"] is True
    assert core.consumer.commits == [(core.tp, 8), (core.tp, 8)]


async def test_a_retryable_failure_goes_back_to_its_partition_signed_for_the_next_attempt(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(fails("dataset_unavailable", retryable=True)))
    assert await run_one(core) == [State.QUEUED, State.TRAINING, State.RETRYING]
    assert core.types("r1") == ["accepted", "started", "retrying"]
    [again] = core.requeued()
    assert again.key == b"r1" and again.value == core.record(sft_request("r1")).value  # byte for byte
    state = core.scheduler.retries.read(core.record(sft_request("r1"), headers=again.headers))
    assert state.attempt == 2 and state.due is not None and state.due > time.time() + 20  # after retry_backoff_s
    assert core.consumer.commits == [(core.tp, 8)] and not core.dead_letters()


async def test_the_last_attempt_of_a_retryable_failure_ends_failed_and_in_the_dlq(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(crash()))
    first = core.record(sft_request("r1"), 7)
    signed = core.scheduler.retries.headers(first.key, first.value or b"", 2, time.time() - 1)  # attempt 2 of 2, due
    record = core.record(sft_request("r1"), 7, headers=signed)
    await core.scheduler.offer(core.tp, record, core.request(record))
    await core.scheduler.jobs[core.tp].task
    failed = core.events("r1")[-1]
    assert (failed["type"], failed["code"], failed["attempt"], failed["retryable"]) == (
        "failed",
        "child_crashed",
        2,
        True,
    )
    assert "killed by SIGKILL" in str(failed["message"])
    [dead] = core.dead_letters()
    assert dead.header("adapterd-reason") == b"attempts_exhausted" and dead.header("adapterd-attempts") == b"2"
    assert core.consumer.commits == [(core.tp, 8)] and not core.requeued()


@pytest.mark.parametrize("stage", ["preflight", "load_dataset", "load_model", "train", "save"])
async def test_a_child_that_dies_in_any_stage_is_retried_from_that_stage(settings: Settings, stage: str) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(crash(stage)))
    await run_one(core)
    retrying = core.events("r1")[-1]
    assert (retrying["type"], retrying["code"], retrying["stage"]) == ("retrying", "child_crashed", stage)
    assert len(core.requeued()) == 1 and core.consumer.commits == [(core.tp, 8)]


@pytest.mark.parametrize("stage", ["load_model", "train"])
async def test_a_child_silent_while_loading_or_training_is_stopped_as_stalled(settings: Settings, stage: str) -> None:
    children = FakeChildren(Script(messages=[StageEntered(stage=stage)], hang=True))  # type: ignore[arg-type]
    core = CoreOnFakes(settings.model_copy(update={"stall_timeout_s": 0.2}), children=children)
    await run_one(core)
    retrying = core.events("r1")[-1]
    assert (retrying["type"], retrying["code"], retrying["stage"]) == ("retrying", "stalled", stage)
    assert (
        children.taken[0].stopped_with == 0
    )  # killed at once: a silent child would not save a checkpoint in any grace


async def test_a_failure_that_is_not_retryable_ends_failed_at_once(settings: Settings) -> None:
    core = CoreOnFakes(settings, children=FakeChildren(fails("dataset_invalid", retryable=False)))
    await run_one(core)
    failed = core.events("r1")[-1]
    assert (failed["type"], failed["code"], failed["stage"], failed["retryable"]) == (
        "failed",
        "dataset_invalid",
        "train",
        False,
    )
    assert core.consumer.commits == [(core.tp, 8)] and not core.dead_letters() and not core.requeued()


async def test_a_job_past_its_timeout_is_stopped_and_fails(settings: Settings) -> None:
    children = FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True))
    core = CoreOnFakes(settings, children=children)
    await run_one(core, timeout_s=1)
    failed = core.events("r1")[-1]
    assert (failed["type"], failed["code"], failed["stage"]) == ("failed", "timeout", "train")
    assert children.taken[0].stopped_with == 0  # the child was stopped, not left running, and at once: its time is up
    assert core.consumer.commits == [(core.tp, 8)]


async def hanging_job(settings: Settings, *messages: ChildMessage) -> tuple[CoreOnFakes, FakeChild, RunningJob]:
    """Request r1's job, its child training (after `messages`) until it is stopped."""
    children = FakeChildren(Script(messages=[StageEntered(stage="train"), *messages], hang=True))
    core = CoreOnFakes(settings, children=children)
    record = core.record(sft_request("r1"), 7)
    await core.scheduler.offer(core.tp, record, core.request(record))
    await asyncio.wait_for(children.hanging.wait(), 5)
    return core, children.taken[0], core.scheduler.jobs[core.tp]


async def test_cancelling_a_running_job_stops_its_child_and_ends_cancelled(settings: Settings) -> None:
    core, child, job = await hanging_job(settings)
    await core.scheduler.cancel(Cancel(request_id="r1", reason="operator asked"))
    await job.task
    assert job.runner.lifecycle.history == [State.QUEUED, State.TRAINING, State.CANCELLED]
    assert (
        core.types("r1") == ["accepted", "started", "cancelled"] and core.events("r1")[-1]["reason"] == "operator asked"
    )
    assert child.stopped_with == 0  # a cancel kills at once: no checkpoint wanted
    assert core.consumer.commits == [(core.tp, 8)] and core.slots.busy == 0


async def test_a_request_cancelled_before_it_is_reached_is_skipped(settings: Settings) -> None:
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    await core.scheduler.cancel(Cancel(request_id="r1", reason="not wanted"))
    record = core.record(sft_request("r1"), 7)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.SKIPPED  # go on with the next
    assert core.types("r1") == ["cancelled"] and children.taken == []
    assert core.consumer.commits == [(core.tp, 8)]


async def test_a_daemon_stop_lets_the_job_checkpoint_and_commits_nothing(settings: Settings) -> None:
    core, child, job = await hanging_job(settings, StoppedAtCheckpoint(step=2, path="checkpoint-2"))
    await core.scheduler.cancel(Cancel(request_id="r1", reason="asked just before the stop"))  # the stop wins over it
    await core.scheduler.stop_jobs()
    assert job.runner.lifecycle.history == [State.QUEUED, State.TRAINING, State.INTERRUPTED]
    assert core.types("r1") == ["accepted", "started"]  # no terminal event: the request is read again after a restart
    assert child.stopped_with == settings.drain_timeout_s
    assert core.consumer.commits == []


async def test_a_stopped_job_says_the_step_it_stopped_and_checkpointed_at_not_its_last_progress_report(
    settings: Settings,
) -> None:
    # Issue 57: progress reports are throttled (progress_interval_s), so the last one trails the stop (335 vs 390):
    # the `preempted` event reads these, and a consumer counting work kept must see 390.
    core, child, job = await hanging_job(
        settings,
        ProgressReport(step=335, total_steps=1000),
        CheckpointSaved(step=300, path="checkpoint-300"),
        CheckpointSaved(step=390, path="checkpoint-390"),
        StoppedAtCheckpoint(step=390, path="checkpoint-390"),
    )
    await core.scheduler.stop_jobs()
    assert job.runner.supervisor.stop_steps() == (390, 390)


async def test_a_job_stopped_before_it_saved_on_the_stop_keeps_its_last_checkpoint(settings: Settings) -> None:
    core, child, job = await hanging_job(
        settings, CheckpointSaved(step=300, path="checkpoint-300"), ProgressReport(step=335, total_steps=1000)
    )
    await core.scheduler.stop_jobs()
    assert job.runner.supervisor.stop_steps() == (335, 300)  # it stopped at its last report; it resumes from 300


async def test_a_partition_that_moves_away_stops_its_job_uncommitted(settings: Settings) -> None:
    core, child, job = await hanging_job(settings)
    await core.scheduler.on_assigned(set())  # the rebalance gave this member nothing
    await asyncio.gather(job.task, return_exceptions=True)
    assert core.types("r1") == ["accepted", "started"] and core.consumer.commits == []
    assert child.stopped_with == settings.drain_timeout_s and core.slots.busy == 0


async def test_a_request_that_does_not_fit_holds_its_partition_until_a_slot_frees(settings: Settings) -> None:
    children = FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True), SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    first, second = core.record(sft_request("r1"), 7), core.record(sft_request("r2"), 8)
    await core.scheduler.offer(core.tp, first, core.request(first))
    other = type(core.tp)(core.tp.topic, 1)
    core.consumer.committed[other] = 0
    assert await core.scheduler.offer(other, second, core.request(second)) is Offered.NO_SLOT
    assert core.consumer.sought[other] == 8 and other in core.consumer.paused  # held at the request, no job
    [running] = core.scheduler.jobs.values()
    assert running.request_id == "r1"
    # The slot frees: the held partition is read again from its request, which now starts.
    await children.hanging.wait()
    await core.scheduler.cancel(Cancel(request_id="r1", reason="make room"))
    await running.task
    assert core.slots.busy == 0 and other not in core.consumer.paused
    assert await core.scheduler.offer(other, second, core.request(second)) is Offered.STARTED
    assert [job.request_id for job in core.scheduler.jobs.values()] == ["r2"]
    await core.scheduler.stop_jobs()  # nothing left hanging after the test


async def test_a_retry_read_before_it_is_due_waits_alone_or_goes_behind_the_requests_after_it(
    settings: Settings,
) -> None:
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    first = core.record(sft_request("r1"), 7)
    signed = core.scheduler.retries.headers(
        first.key, first.value or b"", 2, time.time() + 30
    )  # attempt 2, due in 30 s
    early = core.record(sft_request("r1"), 7, headers=signed)

    assert await core.scheduler.offer(core.tp, early, core.request(early)) is Offered.WAITING
    assert core.consumer.sought[core.tp] == 7 and core.tp in core.consumer.paused and core.tp in core.scheduler.waiting
    assert core.slots.busy == 0 and children.taken == [] and core.consumer.commits == []

    core.scheduler.wake({core.tp: 9})  # a request arrived behind it: its partition is read again
    assert core.tp not in core.scheduler.waiting and core.tp not in core.consumer.paused
    core.consumer.ends[core.tp] = 9  # the broker's end: a request stands behind the retry
    assert await core.scheduler.offer(core.tp, early, core.request(early)) is Offered.DEFERRED
    [again] = core.requeued()
    assert again.value == early.value and again.headers == early.headers  # byte for byte, headers and all
    assert core.consumer.commits == [(core.tp, 8)] and children.taken == [] and core.events() == []


async def test_a_jobs_slot_takes_the_next_request_while_it_is_pushed(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The child has exited with its result: the GPU is free, while the upload (minutes for a merged
    # model) goes on. The job's partition stays held until its terminal event is committed.
    import threading

    from daemon.job import runner as job_module

    pushing, release = threading.Event(), threading.Event()
    real_push = job_module.hub_push.push

    def slow_push(*args: object, **kwargs: object) -> object:
        pushing.set()
        release.wait(30)
        return real_push(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(job_module.hub_push, "push", slow_push)
    core = CoreOnFakes(
        settings, children=FakeChildren(SUCCEEDS, Script(messages=[StageEntered(stage="train")], hang=True))
    )
    first, second = core.record(sft_request("r1"), 7), core.record(sft_request("r2"), 8)
    other = type(core.tp)(core.tp.topic, 1)
    core.consumer.committed[other] = 0
    assert await core.scheduler.offer(core.tp, first, core.request(first)) is Offered.STARTED
    await asyncio.to_thread(pushing.wait, 30)
    assert core.slots.busy == 0 and core.tp in core.consumer.paused  # the slot is free; the partition is still held
    assert await core.scheduler.offer(other, second, core.request(second)) is Offered.STARTED
    assert (
        core.types("r1") == ["accepted", "started", "progress"] and core.consumer.commits == []
    )  # r1 is still pushing
    release.set()
    await core.scheduler.jobs[core.tp].task
    assert core.types("r1")[-1] == "succeeded" and core.consumer.commits == [(core.tp, 8)]
    assert core.slots.busy == 1 and [job.request_id for job in core.scheduler.jobs.values()] == [
        "r2"
    ]  # r2's slot, not given back twice
    await core.scheduler.stop_jobs()
    assert core.slots.busy == 0


STOP_PATHS = {
    # path: what stops it, the Stop it must go through, the states and events it ends with, the child's grace
    "cancel": ("cancel", [State.CANCELLED], ["cancelled"], 0.0),
    "timeout": ("timeout", [State.FAILED], ["failed"], 0.0),
    "stall": ("stalled", [State.RETRYING], ["retrying"], 0.0),
    "daemon stop": ("interrupt", [State.INTERRUPTED], [], 60.0),
    "partition moved": ("interrupt", [State.INTERRUPTED], [], 60.0),
}


@pytest.mark.parametrize("path", list(STOP_PATHS))
async def test_every_way_a_job_is_stopped_goes_through_jobrunner_stop(
    settings: Settings, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each path that ends a job early calls `JobRunner.stop` once, with its kind, and the child gets
    that stop's grace through `ChildHandle.stop` (never a bare cancel of the task running it); what the
    job ends in is decided by the stop alone."""
    from daemon.job.runner import JobRunner

    kind, ending, published, grace = STOP_PATHS[path]
    stops: list[Stop] = []
    real_stop = JobRunner.stop

    def recording_stop(runner: JobRunner, stop: Stop) -> bool:
        stops.append(stop)
        return real_stop(runner, stop)

    monkeypatch.setattr(JobRunner, "stop", recording_stop)
    settings = settings.model_copy(
        update={"drain_timeout_s": grace or 60.0, "stall_timeout_s": 0.2 if path == "stall" else None}
    )
    children = FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True))
    core = CoreOnFakes(settings, children=children)
    record = core.record(sft_request("r1", **({"timeout_s": 1} if path == "timeout" else {})), 7)
    await core.scheduler.offer(core.tp, record, core.request(record))
    job = core.scheduler.jobs[core.tp]
    await asyncio.wait_for(children.hanging.wait(), 5)
    if path == "cancel":
        await core.scheduler.cancel(Cancel(request_id="r1", reason="operator asked"))
    elif path == "daemon stop":
        await core.scheduler.stop_jobs()
    elif path == "partition moved":
        await core.scheduler.on_assigned(set())
    await job.task
    [child] = children.taken
    assert [stop.kind for stop in stops] == [kind]
    assert child.stops == [grace] and not child.cancelled_unstopped
    assert job.runner.lifecycle.history == [State.QUEUED, State.TRAINING, *ending]
    assert core.types("r1") == ["accepted", "started", *published]
    assert core.consumer.commits == ([(core.tp, 8)] if published else [])
    if published and published != ["cancelled"]:
        assert core.events("r1")[-1]["code"] == kind


async def test_a_job_stopped_before_its_child_starts_publishes_only_what_its_stop_says(settings: Settings) -> None:
    """Stopped between its acceptance and its start: no child is taken, and the stop decides."""
    children = FakeChildren(SUCCEEDS)
    core = CoreOnFakes(settings, children=children)
    record = core.record(sft_request("r1"), 7)
    await core.scheduler.offer(core.tp, record, core.request(record))
    job = core.scheduler.jobs[core.tp]
    await core.scheduler.cancel(Cancel(request_id="r1", reason="at once"))  # before the job's task has run at all
    await job.task
    assert children.taken == [] and job.runner.lifecycle.history == [State.QUEUED, State.CANCELLED]
    assert core.types("r1") == ["accepted", "cancelled"] and core.consumer.commits == [(core.tp, 8)]


class Elsewhere(FakeChildren):
    """A source whose children run on another machine (a remote engine's jobs): no pid on
    this host, a name of its own."""

    async def start(self, job: ChildJob) -> ChildHandle:
        child = await super().start(job)
        assert isinstance(child, FakeChild)
        child.where = ChildPlace(f"engine job-{len(self.taken)} for {job.gpus} GPU(s)")
        return child


async def test_a_child_that_runs_elsewhere_fits_the_seam_and_started_names_where_it_runs(settings: Settings) -> None:
    """The child seam (daemon/children/processes.py) takes a child with no process on this host: the source is handed
    the whole job (its spec as a value, devices, GPUs) and chooses the child; `started` says where it runs, its pid
    null, and the job's lifecycle, events and status run as for a local child (tests/daemon/core/test_child_seam.py:
    a child that is no process at all)."""
    children = Elsewhere(SUCCEEDS)
    core = CoreOnFakes(settings.model_copy(update={"gpus": ["0", "1"]}), children=children)
    record = core.record(sft_request("far", resources={"gpus": 2}), 7)
    assert await core.scheduler.offer(core.tp, record, core.request(record)) is Offered.STARTED
    job = core.scheduler.jobs[core.tp]
    await turns_until(lambda: job.runner.supervisor.child is not None)
    assert job.runner.status()["pid"] is None
    await job.task
    started = core.events("far")[1]
    assert (
        started["type"] == "started" and started["pid"] is None and started["child"] == "engine job-1 for 2 GPU(s)"
    ), started
    assert core.types("far") == ["accepted", "started", "progress", "succeeded"] and core.slots.busy == 0
    assert children.taken[0].spec is not None and children.taken[0].spec.request["request_id"] == "far"
