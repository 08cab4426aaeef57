"""Retention of job folders (daemon/store/retention.py): a succeeded job's checkpoints first, whole
folders by age and by count, the least recently changed first; never a running job's folder, and a
failed or unfinished job keeps its checkpoints while its folder is kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from daemon.store.retention import prune

DAY = 86400.0
NOW = 1_800_000_000.0


def job(jobs: Path, name: str, days_ago: float, *, succeeded: bool = False, checkpoint_bytes: int = 1000) -> Path:
    folder = jobs / name
    (folder / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors").write_bytes(b"w" * checkpoint_bytes)
    (folder / "child.log").write_text("step 4\n")
    (folder / "journal.json").write_text(
        json.dumps({"succeeded": {"type": "succeeded"}} if succeeded else {"trained": None})
    )
    when = NOW - days_ago * DAY
    for path in (folder / "checkpoints", folder / "child.log", folder / "journal.json", folder):
        os.utime(path, (when, when))
    return folder


def test_a_pass_removes_what_the_operator_said_and_nothing_else(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    published = job(jobs, "published", 1, succeeded=True)
    failed = job(jobs, "failed", 2)
    old = job(jobs, "old", 20, succeeded=True)
    running = job(jobs, "running", 30)  # older than the limit, but a job of this daemon's uses it
    (tmp_path / "outside").mkdir()
    (jobs / "link").symlink_to(tmp_path / "outside")  # never followed, never removed

    pruned = prune(jobs, running={"running"}, max_age_s=14 * DAY, max_count=500, now=NOW)

    assert pruned.folders == ["old"] and not old.exists()
    assert pruned.checkpoints == ["published"] and not (published / "checkpoints").exists()
    assert (published / "journal.json").exists() and (
        published / "child.log"
    ).exists()  # the record that answers a redelivery stays
    assert (failed / "checkpoints" / "checkpoint-4").is_dir()  # sent again, it resumes from there
    assert (running / "checkpoints").is_dir() and (tmp_path / "outside").is_dir()
    assert pruned.freed_bytes >= 2000


def test_beyond_the_count_the_least_recently_changed_go_first(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for index in range(5):
        job(jobs, f"job-{index}", days_ago=index)  # job-0 changed last
    pruned = prune(jobs, running=(), max_age_s=14 * DAY, max_count=3, now=NOW)
    assert sorted(pruned.folders) == ["job-3", "job-4"] and sorted(path.name for path in jobs.iterdir()) == [
        "job-0",
        "job-1",
        "job-2",
    ]


def test_a_log_that_grows_keeps_its_folder(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    folder = job(jobs, "long", 30)
    os.utime(folder / "child.log", (NOW - 60, NOW - 60))  # a line a minute ago: the job still writes
    assert prune(jobs, running=(), max_age_s=14 * DAY, max_count=500, now=NOW).folders == []
    assert prune(tmp_path / "none", running=(), max_age_s=DAY, max_count=1, now=NOW).folders == []  # no jobs folder yet


async def test_the_daemons_pass_spares_its_running_jobs_and_counts_what_it_removed(tmp_path: Path) -> None:
    import time

    from daemon.ops import metrics
    from daemon.service import Service
    from daemon.settings import Settings
    from testbed.memory_kafka import FakeConsumer, FakeProducer

    settings = Settings(
        work_dir=tmp_path / "work", gpus=[], warm_child=False, metrics_address=None, job_retention_days=7
    )
    service = Service(settings, consumer=FakeConsumer(), producer=FakeProducer())  # type: ignore[arg-type]
    ago = (NOW - time.time()) / DAY  # job() dates folders back from NOW: these are 30 and 31 days old today
    job(settings.jobs_dir, "stale", 30 + ago)
    job(settings.jobs_dir, "in-use", 31 + ago)
    service.scheduler.jobs[object()] = type("Running", (), {"request_id": "in-use"})()  # type: ignore[index]
    before = metrics.PRUNED.labels("folder")._value.get()
    pruned = await service.prune_once()
    assert pruned is not None and pruned.folders == ["stale"]
    assert not (settings.jobs_dir / "stale").exists() and (settings.jobs_dir / "in-use").is_dir()
    assert metrics.PRUNED.labels("folder")._value.get() == before + 1


def test_a_job_that_starts_on_an_old_folder_during_a_pass_keeps_it_and_its_new_log(tmp_path: Path) -> None:
    # Issue 46: the pass reads the folders, then a job starts on an old one (a request sent again)
    # and writes its log before the pass removes it. The seam: the pass's `take`, which a job's
    # first line precedes here, exactly between the read and the removal.
    from daemon.store import retention

    jobs = tmp_path / "jobs"
    old = job(jobs, "sent-again", 30)
    job(jobs, "stale", 31)

    def job_starts_then_take(target: Path, folder: Path, changed: float) -> Path | None:
        if folder.name == "sent-again":
            (folder / "child.log").write_text("attempt 2: step 1\n")
            os.utime(
                folder / "child.log", (NOW - 1, NOW - 1)
            )  # a second ago, on the test's clock: newer than the pass read
        return retention.set_aside(target, folder, changed)

    pruned = prune(jobs, running=(), max_age_s=14 * DAY, max_count=500, now=NOW, take=job_starts_then_take)

    assert pruned.folders == ["stale"] and not (jobs / "stale").exists()
    assert (old / "child.log").read_text() == "attempt 2: step 1\n" and (old / "checkpoints" / "checkpoint-4").is_dir()
    assert sorted(path.name for path in jobs.iterdir()) == ["sent-again"]  # nothing left set aside


async def test_a_job_the_daemon_starts_during_a_pass_keeps_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The same race in the daemon, before the job has written anything: the scheduler takes the
    # request while the pass (in its thread) reads the folders. The seam: reading the folder's age,
    # which here waits until the loop has registered the job. The set-aside checks the scheduler's
    # jobs on the loop, so the folder stays; a snapshot taken as the pass began would not see it.
    import asyncio
    import time

    from daemon.service import Service
    from daemon.settings import Settings
    from daemon.store import retention
    from testbed.memory_kafka import FakeConsumer, FakeProducer

    settings = Settings(
        work_dir=tmp_path / "work", gpus=[], warm_child=False, metrics_address=None, job_retention_days=7
    )
    service = Service(settings, consumer=FakeConsumer(), producer=FakeProducer())  # type: ignore[arg-type]
    ago = (NOW - time.time()) / DAY
    folder = job(settings.jobs_dir, "sent-again", 30 + ago)
    job(settings.jobs_dir, "stale", 31 + ago)
    loop = asyncio.get_running_loop()
    read_age = retention.last_change

    async def the_scheduler_takes_the_request() -> None:
        service.scheduler.jobs[object()] = type("Running", (), {"request_id": "sent-again"})()  # type: ignore[index]

    def last_change_while_a_job_starts(path: Path) -> float:
        if path.name == "sent-again" and not service.scheduler.jobs:
            asyncio.run_coroutine_threadsafe(the_scheduler_takes_the_request(), loop).result(10)
        return read_age(path)

    monkeypatch.setattr(retention, "last_change", last_change_while_a_job_starts)
    pruned = await service.prune_once()

    assert pruned is not None and pruned.folders == ["stale"]
    assert (folder / "child.log").exists() and (folder / "checkpoints" / "checkpoint-4").is_dir()


def test_a_checkpoints_link_is_neither_walked_nor_counted(tmp_path: Path) -> None:
    # Issue 46: a succeeded job's `checkpoints` that is a link to a big tree elsewhere: not walked,
    # not reported as freed, its tree untouched; the link goes with its folder, the tree stays.
    jobs = tmp_path / "jobs"
    big = tmp_path / "elsewhere" / "tree"
    (big / "deep").mkdir(parents=True)
    (big / "deep" / "weights.bin").write_bytes(b"x" * 100_000)
    kept = job(jobs, "linked", 1, succeeded=True, checkpoint_bytes=0)
    gone = job(jobs, "linked-old", 30, succeeded=True, checkpoint_bytes=0)
    for folder in (kept, gone):
        for entry in (folder / "checkpoints").rglob("*"):
            if entry.is_file():
                entry.unlink()
        (folder / "checkpoints" / "checkpoint-4").rmdir()
        (folder / "checkpoints").rmdir()
        (folder / "checkpoints").symlink_to(big, target_is_directory=True)
        (folder / "weights-link").symlink_to(big / "deep" / "weights.bin")  # a link to a file: not counted either
    own = sum(path.lstat().st_size for path in gone.iterdir() if path.is_file() and not path.is_symlink())

    pruned = prune(jobs, running=(), max_age_s=14 * DAY, max_count=500, now=NOW)

    assert pruned.checkpoints == [] and (kept / "checkpoints").is_symlink()  # not a folder of checkpoints
    assert pruned.folders == ["linked-old"] and not gone.exists()
    assert pruned.freed_bytes == own < 100_000
    assert (big / "deep" / "weights.bin").stat().st_size == 100_000
