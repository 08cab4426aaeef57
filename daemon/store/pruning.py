"""Retention in the checkpoint store, by the disk's rules (daemon/store/retention.py): a succeeded job's
checkpoints go (its `succeeded` event stays), then a request's all by age and by count, never those
of a job this daemon runs.

A job's own host removes its checkpoints from the store when it succeeds (daemon/job/uploads.py,
`abandon`); this pass catches what that missed (the store was down then, or the host was lost after
its push): a request whose journal on this host says `succeeded`; a request whose newest checkpoint
is older than `job_retention_days`; and past `job_retention_count` requests, the least recently
written first. Every host of the fleet runs it on the same store, to the same end.

What it cannot see: a job running on another host. The age rule leaves it alone as long as it saves
more often than `job_retention_days`; the count rule never takes a request written to within
`RECENT_S`, so a running job is reached only if it has saved nothing for that long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from daemon.settings import Settings
from daemon.store.checkpoints import CheckpointStore, StoreError
from daemon.store.opening import store_of
from daemon.store.retention import succeeded

log = structlog.get_logger()

RECENT_S = 6 * 3600.0


@dataclass
class StorePruned:
    """The request ids whose checkpoints left the store in one pass, by why."""

    succeeded: list[str] = field(default_factory=list)
    aged: list[str] = field(default_factory=list)
    counted: list[str] = field(default_factory=list)


def last_written(store: CheckpointStore, request_id: str) -> float | None:
    """When the request's newest checkpoint was written: its manifest's time, or for one without a
    whole checkpoint its files' newest modification time; None when the store cannot say."""
    complete = store.complete(request_id)
    if complete:
        return max(manifest.written_at for manifest in complete)
    try:
        return max(
            (store.fs.modified(path).timestamp() for path in store.fs.find(store.path(request_id))), default=None
        )
    except (NotImplementedError, OSError, ValueError):
        return None


def prune_store(
    store: CheckpointStore, jobs_dir: Path, running: Collection[str], max_age_s: float, max_count: int, now: float
) -> StorePruned:
    """One pass over the store; `running`: this daemon's jobs (left alone)."""
    pruned = StorePruned()
    written: dict[str, float] = {}
    for request_id in store.requests():
        if request_id in running:
            continue
        if succeeded(jobs_dir / request_id) and store.remove_checkpoints(request_id):
            pruned.succeeded.append(request_id)  # its succeeded.json stays, to its age or its count
        when = last_written(store, request_id)
        if when is None:
            continue  # age unknown: kept
        if now - when > max_age_s:
            store.remove(request_id)
            pruned.aged.append(request_id)
        else:
            written[request_id] = when
    newest_first = sorted(written, key=written.__getitem__, reverse=True)
    for request_id in newest_first[max_count:]:
        if now - written[request_id] > RECENT_S:
            store.remove(request_id)
            pruned.counted.append(request_id)
    return pruned


async def prune_store_once(settings: Settings, running: Collection[str], now: float) -> StorePruned | None:
    """One pass in a worker thread, when the host has a store; None without one or when it failed (said)."""
    store = store_of(settings)
    if store is None:
        return None
    try:
        pruned = await asyncio.to_thread(
            prune_store,
            store,
            settings.jobs_dir,
            running,
            settings.job_retention_days * 86400,
            settings.job_retention_count,
            now,
        )
    except StoreError as exc:
        log.warning("store_retention.failed", error=str(exc))
        return None
    if pruned.succeeded or pruned.aged or pruned.counted:
        log.info("store_retention.pruned", succeeded=pruned.succeeded, aged=pruned.aged, counted=pruned.counted)
    return pruned
