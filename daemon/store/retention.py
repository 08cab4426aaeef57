"""Job folders kept as long as the operator says: a published job's checkpoints first, then whole
folders by age and by count, never the folder of a job this daemon runs.

A job's folder (`work_dir/jobs/<request id>`) holds its spec, its log, its checkpoints (most of its
bytes), its artifact and its journal. Checkpoints only serve to resume a job that has not finished:
once the journal says `succeeded`, they go at the next pass. A whole folder goes once nothing in it
has changed for `job_retention_days`, or when more than `job_retention_count` folders are kept, the
least recently changed first. A failed or unfinished job keeps its checkpoints until its folder
goes: the same request sent again resumes from them.

A job may start on an old folder while a pass runs (a request sent again). A pass reads the folders
first, then takes each one it removes out of the jobs' way with one rename (`set_aside`: to a
`.removing-...` name in the same folder, which no request id can have), and only then deletes it: the
rename is refused when the folder changed since it was read, and, in the daemon, it runs on the
event loop, where jobs start, after checking that no job of this daemon uses the folder
(`on_loop`). A job that starts during a pass so keeps its folder and its new log, or finds no
folder and starts afresh; never a folder deleted under it. The daemon's pass, at its start and then
hourly, is `prune_folders_once`.

Nothing is followed through a symbolic link: a folder's entries are read with lstat, a link (a
`checkpoints` link to a big tree) is neither walked nor counted as freed, and removing a folder
removes the link, not what it points to.

What removing a folder gives up: its journal is what answers a redelivered request without training
it again. Past it, a redelivered request is known by its Hub commit (the Hub sink) or trained again
(the local sink, whose published adapters under work_dir/outputs are never touched here).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import uuid
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from daemon import executors
from daemon.ops import metrics
from daemon.settings import Settings

log = structlog.get_logger()

TRASH_PREFIX = ".removing-"  # a request id never starts with "." (schemas/common.py)
TAKE_TIMEOUT_S = 30.0  # how long a pass waits for the loop to set a folder aside before it leaves it

# (what goes, the job folder it is or is in, when that folder last changed as the pass read it) →
# where it was moved to be deleted, or None when it stays.
Take = Callable[[Path, Path, float], Path | None]


@dataclass
class Pruned:
    """What one pass removed: the request ids whose checkpoints went, those whose folders went, and the bytes freed."""

    checkpoints: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    freed_bytes: int = 0


def prune(
    jobs_dir: Path, running: Collection[str], max_age_s: float, max_count: int, now: float, take: Take | None = None
) -> Pruned:
    """One pass over `jobs_dir`; `running`: the request ids whose folders are in use (left alone);
    `take`: sets each folder or checkpoints folder aside before it is deleted (`set_aside`, or
    `on_loop`'s in the daemon)."""
    take = take or set_aside
    pruned = Pruned()
    if not jobs_dir.is_dir():
        return pruned
    for leftover in _entries(jobs_dir, TRASH_PREFIX):  # set aside by a pass that did not finish
        _delete(leftover)
    folders = [path for path in _entries(jobs_dir) if path.name not in running]
    changed = {path: last_change(path) for path in folders}
    newest_first = sorted(folders, key=lambda path: changed[path], reverse=True)
    for index, folder in enumerate(newest_first):
        if now - changed[folder] > max_age_s or index >= max_count:
            aside = take(folder, folder, changed[folder])
            if aside is not None:
                pruned.freed_bytes += _delete(aside)
                pruned.folders.append(folder.name)
        elif succeeded(folder) and _is_folder(folder / "checkpoints"):
            aside = take(folder / "checkpoints", folder, changed[folder])
            if aside is not None:
                pruned.freed_bytes += _delete(aside)
                pruned.checkpoints.append(folder.name)
    return pruned


async def prune_folders_once(settings: Settings, running: Callable[[], Collection[str]], now: float) -> Pruned | None:
    """The daemon's pass: `prune` in the `retention` worker thread, the jobs `running` names left alone,
    those that start during the pass too (checked on the loop as each folder is set aside, `on_loop`);
    None when it could not read or remove a folder (said, and tried next time)."""
    take = on_loop(asyncio.get_running_loop(), lambda name: name in running())
    try:
        pruned = await executors.run(
            "retention",
            prune,
            settings.jobs_dir,
            running(),
            settings.job_retention_days * 86400,
            settings.job_retention_count,
            now,
            take,
        )
    except OSError as exc:
        log.warning("retention.failed", error=str(exc))
        return None
    if pruned.folders or pruned.checkpoints:
        log.info(
            "retention.pruned", folders=pruned.folders, checkpoints=pruned.checkpoints, freed_bytes=pruned.freed_bytes
        )
        metrics.PRUNED.labels("folder").inc(len(pruned.folders))
        metrics.PRUNED.labels("checkpoints").inc(len(pruned.checkpoints))
    return pruned


def set_aside(target: Path, folder: Path, changed: float) -> Path | None:
    """Move `target` (a job's folder, or its checkpoints) to a trash name in the jobs' folder, to be
    deleted there; None, and nothing moved, when `folder` changed after `changed` (a job started on
    it) or `target` is gone."""
    try:
        if last_change(folder) > changed:
            return None
        aside = folder.parent / f"{TRASH_PREFIX}{folder.name}-{uuid.uuid4().hex[:8]}"
        os.rename(target, aside)
    except FileNotFoundError:
        return None
    return aside


def on_loop(loop: asyncio.AbstractEventLoop, in_use: Callable[[str], bool]) -> Take:
    """A `take` for a pass in a worker thread: the check that no job uses the folder (`in_use`, read
    from the scheduler) and the rename run together on `loop`, where jobs start, so that no job can
    start on a folder between the two. A loop that does not answer in TAKE_TIMEOUT_S (stopping)
    leaves the folder; a rename it made after all is deleted by the next pass."""

    async def check_and_set_aside(target: Path, folder: Path, changed: float) -> Path | None:
        return None if in_use(folder.name) else set_aside(target, folder, changed)

    def take(target: Path, folder: Path, changed: float) -> Path | None:
        try:
            return asyncio.run_coroutine_threadsafe(check_and_set_aside(target, folder, changed), loop).result(
                TAKE_TIMEOUT_S
            )
        except (TimeoutError, RuntimeError, asyncio.CancelledError):  # RuntimeError: the loop is closed
            return None

    return take


def last_change(folder: Path) -> float:
    """When anything at the top of a job's folder last changed (its log grows while it trains)."""
    times = [folder.stat().st_mtime]
    for entry in os.scandir(folder):
        try:
            times.append(entry.stat(follow_symlinks=False).st_mtime)
        except OSError:
            continue  # gone meanwhile
    return max(times)


def succeeded(folder: Path) -> bool:
    """Whether the job's journal records its `succeeded` event (daemon/store/journal.py)."""
    try:
        return "succeeded" in json.loads((folder / "journal.json").read_text())
    except (OSError, ValueError):
        return False


def _entries(jobs_dir: Path, prefix: str = "") -> list[Path]:
    """The real folders (lstat: no link) directly in `jobs_dir`: those named with `prefix`, or
    without one the job folders (the trash left out)."""
    found = []
    for entry in os.scandir(jobs_dir):
        if entry.is_dir(follow_symlinks=False) and (
            entry.name.startswith(prefix) if prefix else not entry.name.startswith(TRASH_PREFIX)
        ):
            found.append(Path(entry.path))
    return found


def _is_folder(path: Path) -> bool:
    """Whether `path` is a real folder: lstat, a link to one is not."""
    try:
        return stat.S_ISDIR(path.lstat().st_mode)
    except OSError:
        return False


def _delete(path: Path) -> int:
    """Delete a set-aside folder; the bytes of the regular files it held (lstat: links inside are
    removed, never followed nor counted)."""
    size = 0
    for root, _, files in os.walk(path, followlinks=False):
        for name in files:
            try:
                info = os.lstat(os.path.join(root, name))
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                size += info.st_size
    shutil.rmtree(path, ignore_errors=True)
    return size


def existing_folder(path: Path) -> Path:
    """`path`, or its nearest parent that exists (work_dir before its first job): where the free
    space of the file system it will be on is measured."""
    return next((folder for folder in (path, *path.parents) if folder.exists()), Path("/"))


def free_bytes(path: Path) -> int:
    """Free bytes on the file system `path` is or will be on."""
    return shutil.disk_usage(existing_folder(path)).free
