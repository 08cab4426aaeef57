"""Retention of job folders (daemon/jobs/retention.py): a succeeded job's checkpoints first, whole
folders by age and by count, the least recently changed first; never a running job's folder, and a
failed or unfinished job keeps its checkpoints while its folder is kept."""

from __future__ import annotations

import json
import os
from pathlib import Path

from daemon.jobs.retention import prune

DAY = 86400.0
NOW = 1_800_000_000.0


def job(jobs: Path, name: str, days_ago: float, *, succeeded: bool = False, checkpoint_bytes: int = 1000) -> Path:
    folder = jobs / name
    (folder / "checkpoints" / "checkpoint-4").mkdir(parents=True)
    (folder / "checkpoints" / "checkpoint-4" / "adapter_model.safetensors").write_bytes(b"w" * checkpoint_bytes)
    (folder / "child.log").write_text("step 4\n")
    (folder / "journal.json").write_text(json.dumps({"succeeded": {"type": "succeeded"}} if succeeded else {"trained": None}))
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
    assert (published / "journal.json").exists() and (published / "child.log").exists()  # the record that answers a redelivery stays
    assert (failed / "checkpoints" / "checkpoint-4").is_dir()  # sent again, it resumes from there
    assert (running / "checkpoints").is_dir() and (tmp_path / "outside").is_dir()
    assert pruned.freed_bytes >= 2000


def test_beyond_the_count_the_least_recently_changed_go_first(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for index in range(5):
        job(jobs, f"job-{index}", days_ago=index)  # job-0 changed last
    pruned = prune(jobs, running=(), max_age_s=14 * DAY, max_count=3, now=NOW)
    assert sorted(pruned.folders) == ["job-3", "job-4"] and sorted(path.name for path in jobs.iterdir()) == ["job-0", "job-1", "job-2"]


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

    settings = Settings(work_dir=tmp_path / "work", gpus=[], warm_child=False, metrics_address=None, job_retention_days=7)
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
