"""Job folders kept as long as the operator says: a published job's checkpoints first, then whole
folders by age and by count, never the folder of a job this daemon runs.

A job's folder (`work_dir/jobs/<request id>`) holds its spec, its log, its checkpoints (most of its
bytes), its artifact and its journal. Checkpoints only serve to resume a job that has not finished:
once the journal says `succeeded`, they go at the next pass. A whole folder goes once nothing in it
has changed for `job_retention_days`, or when more than `job_retention_count` folders are kept, the
least recently changed first. A failed or unfinished job keeps its checkpoints until its folder
goes: the same request sent again resumes from them.

What removing a folder gives up: its journal is what answers a redelivered request without training
it again. Past it, a redelivered request is known by its Hub commit (the Hub sink) or trained again
(the local sink, whose published adapters under work_dir/outputs are never touched here).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Pruned:
    """What one pass removed: the request ids whose checkpoints went, those whose folders went, and the bytes freed."""

    checkpoints: list[str] = field(default_factory=list)
    folders: list[str] = field(default_factory=list)
    freed_bytes: int = 0


def prune(jobs_dir: Path, running: Collection[str], max_age_s: float, max_count: int, now: float) -> Pruned:
    """One pass over `jobs_dir`; `running`: the request ids whose folders are in use (left alone)."""
    pruned = Pruned()
    if not jobs_dir.is_dir():
        return pruned
    folders = [path for path in jobs_dir.iterdir() if path.is_dir() and not path.is_symlink() and path.name not in running]
    changed = {path: last_change(path) for path in folders}
    newest_first = sorted(folders, key=lambda path: changed[path], reverse=True)
    for index, folder in enumerate(newest_first):
        if now - changed[folder] > max_age_s or index >= max_count:
            pruned.freed_bytes += _remove(folder)
            pruned.folders.append(folder.name)
        elif succeeded(folder) and (folder / "checkpoints").is_dir():
            pruned.freed_bytes += _remove(folder / "checkpoints")
            pruned.checkpoints.append(folder.name)
    return pruned


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
    """Whether the job's journal records its `succeeded` event (daemon/jobs/journal.py)."""
    try:
        return "succeeded" in json.loads((folder / "journal.json").read_text())
    except (OSError, ValueError):
        return False


def _remove(path: Path) -> int:
    size = sum(entry.stat().st_size for entry in path.rglob("*") if entry.is_file() and not entry.is_symlink())
    shutil.rmtree(path, ignore_errors=True)
    return size


def existing_folder(path: Path) -> Path:
    """`path`, or its nearest parent that exists (work_dir before its first job): where the free
    space of the file system it will be on is measured."""
    return next((folder for folder in (path, *path.parents) if folder.exists()), Path("/"))


def free_bytes(path: Path) -> int:
    """Free bytes on the file system `path` is or will be on."""
    return shutil.disk_usage(existing_folder(path)).free
