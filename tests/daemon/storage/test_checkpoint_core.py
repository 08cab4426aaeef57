"""The checkpoint store in a job's lifecycle, on the in-memory fakes (tests/core.py) and a store in a
shared folder: each checkpoint the child says it saved is uploaded and its event says so, a success
clears the store, a job resumes from the store's newer checkpoint and its `started` says so, and a
stop's deadline bounds the upload (past it, the checkpoint is said to be local only)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from daemon.settings import Settings
from daemon.store.checkpoints import CheckpointStore
from daemon.store.journal import Journal
from daemon.store.opening import store_of
from handlers.protocol import CheckpointSaved, StageEntered, StoppedAtCheckpoint
from tests.core import CoreOnFakes
from tests.daemon.core.test_scheduler_core import RESULT, TRAINS
from tests.daemon.storage.test_checkpoint_store import make_checkpoint
from tests.fakes import FakeChildren, Script
from tests.helpers import fleet_key, sft_request


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        max_attempts=2,
        progress_interval_s=0,
        checkpoint_store=str(tmp_path / "store"),
        event_signing_key_file=fleet_key(tmp_path),
        drain_timeout_s=5.0,
    )


def store(settings: Settings) -> CheckpointStore:
    """The store as the daemon opens it: the fleet's key signs and verifies what is in it."""
    opened = store_of(settings)
    assert opened is not None
    return opened


async def start(core: CoreOnFakes, request_id: str = "r1") -> Any:
    record = core.record(sft_request(request_id), 7)
    await core.scheduler.offer(core.tp, record, core.request(record))
    return core.scheduler.jobs[core.tp]


async def test_a_saved_checkpoint_is_uploaded_said_and_journaled(settings: Settings) -> None:
    saved = make_checkpoint(settings.jobs_dir / "r1" / "checkpoints", 2)
    children = FakeChildren(
        Script(messages=[*TRAINS[:3], CheckpointSaved(step=2, path=str(saved)), *TRAINS[3:4]], hang=True)
    )
    core = CoreOnFakes(settings, children=children)
    job = await start(core)
    await asyncio.wait_for(children.hanging.wait(), 5)
    await job.runner.uploads.finish(None)
    checkpoint = core.events("r1")[-1]
    assert checkpoint["type"] == "checkpoint" and checkpoint["step"] == 2 and checkpoint["path"] == str(saved)
    assert (
        checkpoint["location"] == "store" and checkpoint["store_url"] == f"{settings.checkpoint_store}/r1/checkpoint-2"
    )
    assert Journal(settings.jobs_dir / "r1" / "journal.json").read()["stored_checkpoint"]["step"] == 2
    assert [manifest.step for manifest in store(settings).complete("r1")] == [2]
    await core.scheduler.stop_jobs()
    await job.task


async def test_a_success_clears_the_requests_checkpoints_from_the_store(settings: Settings, tmp_path: Path) -> None:
    store(settings).upload("r1", make_checkpoint(tmp_path / "earlier", 2), 2)
    store(settings).upload("r2", make_checkpoint(tmp_path / "earlier", 3), 3)  # another request's: kept
    core = CoreOnFakes(settings, children=FakeChildren(Script(messages=[*TRAINS, RESULT])))
    await (await start(core)).task
    assert core.types("r1")[-1] == "succeeded"
    assert store(settings).complete("r1") == [] and [manifest.step for manifest in store(settings).complete("r2")] == [
        3
    ]  # r2's kept
    left = store(settings).succeeded("r1")  # its event stays, for a redelivery on any host
    assert left is not None and left["event_id"] == core.events("r1")[-1]["event_id"]


async def test_a_request_that_succeeded_on_another_host_is_answered_from_the_store_without_training(
    settings: Settings, tmp_path: Path
) -> None:
    first = CoreOnFakes(settings, children=FakeChildren(Script(messages=[*TRAINS, RESULT])))
    await (await start(first)).task
    original = first.events("r1")[-1]
    elsewhere = settings.model_copy(
        update={"work_dir": tmp_path / "other-host", "host": "other-host"}
    )  # the first host's disk is gone
    children = FakeChildren(Script(messages=[*TRAINS, RESULT]))
    second = CoreOnFakes(elsewhere, children=children)
    await (await start(second)).task
    assert second.types("r1") == ["accepted", "succeeded"] and children.taken == []
    again = second.events("r1")[-1]
    assert again["duplicate"] is True and again["location"] == original["location"] and again["host"] == "other-host"


async def test_a_job_resumes_from_the_stores_newer_checkpoint_and_started_says_so(
    settings: Settings, tmp_path: Path
) -> None:
    store(settings).upload("r1", make_checkpoint(tmp_path / "other-host", 6), 6)  # an attempt on a host since lost
    make_checkpoint(settings.jobs_dir / "r1" / "checkpoints", 4)  # this host's own, older
    children = FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True))
    core = CoreOnFakes(settings, children=children)
    job = await start(core)
    await asyncio.wait_for(children.hanging.wait(), 5)
    started = core.events("r1")[1]
    assert (started["resumed_step"], started["resumed_from"]) == (6, "store")
    assert (
        settings.jobs_dir / "r1" / "checkpoints" / "checkpoint-6" / "trainer_state.json"
    ).is_file()  # where the trainer resumes
    await core.scheduler.stop_jobs()
    await job.task


async def test_a_stop_uploads_its_checkpoint_before_the_job_ends(settings: Settings) -> None:
    saved = make_checkpoint(settings.jobs_dir / "r1" / "checkpoints", 3)
    children = FakeChildren(
        Script(
            messages=[
                StageEntered(stage="train"),
                CheckpointSaved(step=3, path=str(saved)),
                StoppedAtCheckpoint(step=3, path=str(saved)),
            ],
            hang=True,
        )
    )
    core = CoreOnFakes(settings, children=children)
    job = await start(core)
    await asyncio.wait_for(children.hanging.wait(), 5)
    await core.scheduler.stop_jobs()
    await job.task
    assert core.types("r1") == ["accepted", "started", "checkpoint"]  # interrupted: no terminal event
    assert core.events("r1")[2]["location"] == "store"
    assert [manifest.step for manifest in store(settings).complete("r1")] == [3]


async def test_past_the_stops_deadline_the_checkpoint_is_said_to_be_local_only(settings: Settings) -> None:
    settings = settings.model_copy(update={"drain_timeout_s": 0.5})
    saved = make_checkpoint(settings.jobs_dir / "r1" / "checkpoints", 3)
    release = threading.Event()

    def stuck(self: CheckpointStore, request_id: str, folder: Path, step: int) -> Any:
        release.wait(30)  # a store that takes longer than the deadline
        raise OSError("released")

    children = FakeChildren(
        Script(messages=[StageEntered(stage="train"), CheckpointSaved(step=3, path=str(saved))], hang=True)
    )
    core = CoreOnFakes(settings, children=children)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CheckpointStore, "upload", stuck)
        job = await start(core)
        await asyncio.wait_for(children.hanging.wait(), 5)
        await core.scheduler.stop_jobs()
        await job.task
        release.set()
    assert core.types("r1") == ["accepted", "started", "checkpoint"]
    checkpoint = core.events("r1")[2]
    assert checkpoint["location"] == "local" and "deadline passed" in str(checkpoint["store_error"])
    assert saved.is_dir()  # resumable here still
