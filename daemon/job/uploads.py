"""One job's checkpoints into the operator's store (daemon/store/checkpoints.py), beside its
training, and the resume from there.

The child saves a checkpoint and says so; its supervisor hands it here (`saved`). Its files are
hard-linked into `<job>/uploading/` at once (the trainer may delete the folder at its next save,
`save_total_limit`), and a background task uploads it while training goes on: one upload at a
time, and while one runs only the newest saved checkpoint waits (an older waiting one is passed
over: the newer one supersedes it). Each checkpoint's event is published once its fate is known:
`location` 'store' once its manifest is written (and the journal's `stored_checkpoint` says it),
'local' when there is no store or the upload failed (`store_error`); the job goes on either way.

`fetch` runs before a job's child starts: a checkpoint in the store newer than any on this host is
downloaded into the job's checkpoint folder, where the trainer resumes from it.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path
from typing import Any, Literal

import structlog

from daemon.job.events import JobEvents
from daemon.store.checkpoints import CheckpointStore, StoreError
from daemon.store.download import download
from daemon.store.host_checkpoints import local_checkpoints
from daemon.store.journal import Journal
from schemas.events import Checkpoint

log = structlog.get_logger()

Where = Literal["local", "store"]


def fetch(store: CheckpointStore | None, request_id: str, checkpoints: Path) -> tuple[int, Where] | None:
    """Where the job resumes: the newest whole checkpoint in the store when it is newer than this
    host's own (downloaded, checked against its manifest; a corrupt one is skipped for the one
    before it), else this host's newest; None to start at step 0. A store that is down is said and
    passed over."""
    local = local_checkpoints(checkpoints)
    newest_local = max(local) if local else None
    if store is not None:
        try:
            for manifest in store.complete(request_id):
                if newest_local is not None and manifest.step <= newest_local:
                    break
                try:
                    download(store, request_id, manifest, checkpoints)
                except StoreError as exc:
                    log.warning("checkpoint_store.skipped", request_id=request_id, step=manifest.step, error=str(exc))
                    continue
                log.info("checkpoint_store.fetched", request_id=request_id, step=manifest.step, url=manifest.url)
                return manifest.step, "store"
        except StoreError as exc:
            log.warning("checkpoint_store.unreachable", request_id=request_id, error=str(exc))
    return (newest_local, "local") if newest_local is not None else None


def snapshot(folder: Path, into: Path) -> Path:
    """`folder`'s files hard-linked under `into` (copied where links cannot be made): the upload reads
    these. A symbolic link stays one (the upload leaves it out), never followed to what it names."""
    shutil.rmtree(into, ignore_errors=True)
    into.parent.mkdir(parents=True, exist_ok=True)

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(folder, into, symlinks=True, copy_function=link)
    return into


class CheckpointUploads:
    """One job's uploads: `saved` for each checkpoint, `finish` (within a deadline) or `abandon` at its end."""

    def __init__(
        self,
        store: CheckpointStore | None,
        request_id: str,
        job_dir: Path,
        journal: Journal,
        events: JobEvents,
        keep: int,
    ) -> None:
        self.store = store
        self.request_id = request_id
        self.staging = job_dir / "uploading"
        self.journal = journal
        self.events = events
        self.keep = keep
        self.log = log.bind(request_id=request_id)
        self._waiting: tuple[int, str, Path] | None = None
        self._uploading: tuple[int, str] | None = None
        self._worker: asyncio.Task[None] | None = None

    async def saved(self, step: int, path: str) -> None:
        """The child saved checkpoint `step` at `path`: upload it in the background (or say it is local)."""
        if self.store is None:
            await self.events.publish(Checkpoint, step=step, path=path)
            return
        try:
            copy = await asyncio.to_thread(snapshot, Path(path), self.staging / f"checkpoint-{step}")
        except OSError as exc:
            await self._local(step, path, f"the checkpoint's files could not be read for the upload: {exc}")
            return
        if self._waiting is not None:
            passed, passed_path, passed_copy = self._waiting
            shutil.rmtree(passed_copy, ignore_errors=True)
            await self._local(
                passed, passed_path, f"passed over for checkpoint {step}, saved while an earlier one uploaded"
            )
        self._waiting = (step, path, copy)
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._upload_all(), name=f"upload-{self.request_id}")

    async def _upload_all(self) -> None:
        while self._waiting is not None:
            step, path, copy = self._waiting
            self._waiting, self._uploading = None, (step, path)
            await self._upload(step, path, copy)
            self._uploading = None

    async def _upload(self, step: int, path: str, copy: Path) -> None:
        assert self.store is not None
        started = time.monotonic()
        try:
            manifest = await asyncio.to_thread(self.store.upload, self.request_id, copy, step)
        except StoreError as exc:
            await self._local(step, path, str(exc))
            return
        finally:
            shutil.rmtree(copy, ignore_errors=True)
        seconds = round(time.monotonic() - started, 3)
        size = sum(size for size, _ in manifest.files.values())
        self.log.info("checkpoint_store.uploaded", step=step, url=manifest.url, bytes=size, seconds=seconds)
        self.journal.record(
            "stored_checkpoint", {"step": step, "url": manifest.url, "bytes": size, "upload_s": seconds}
        )
        await self.events.publish(Checkpoint, step=step, path=path, location="store", store_url=manifest.url)
        await asyncio.to_thread(self._prune_older, step)

    def _prune_older(self, newest: int) -> None:
        """Keep the newest `keep` whole checkpoints of the request in the store; older ones go."""
        assert self.store is not None
        try:
            for manifest in self.store.complete(self.request_id)[self.keep :]:
                if manifest.step < newest:
                    self.store.remove(self.request_id, manifest.step)
        except StoreError as exc:
            self.log.warning("checkpoint_store.prune_failed", error=str(exc))

    async def _local(self, step: int, path: str, error: str) -> None:
        self.log.warning("checkpoint_store.local_only", step=step, error=error)
        await self.events.publish(Checkpoint, step=step, path=path, location="local", store_error=error)

    async def earlier_success(self) -> dict[str, Any] | None:
        """The request's `succeeded` as another host left it in the store; None without one (or
        a store that is down: said)."""
        if self.store is None:
            return None
        try:
            return await asyncio.to_thread(self.store.succeeded, self.request_id)
        except StoreError as exc:
            self.log.warning("checkpoint_store.unreachable", error=str(exc))
            return None

    async def finish(self, timeout_s: float | None) -> None:
        """Wait for the uploads under way, at most `timeout_s` (a stop's deadline): past it, the
        checkpoint waiting or uploading is said to be local only."""
        if self._worker is None:
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._worker), timeout_s)
        except TimeoutError:
            self._worker.cancel()  # the upload's thread runs on to its end; its manifest may still land, then it counts
            await asyncio.gather(self._worker, return_exceptions=True)
            for unsent in (self._uploading, self._waiting[:2] if self._waiting else None):
                if unsent is not None:
                    await self._local(unsent[0], unsent[1], "the stop's deadline passed before it was uploaded")
            self._waiting = self._uploading = None
            self.log.warning("checkpoint_store.deadline_passed", timeout_s=timeout_s)

    async def abandon(self, succeeded: dict[str, Any] | None = None) -> None:
        """The job succeeded: its checkpoints serve no one now. Uploads stop (what was not uploaded is
        said to be local), the store's checkpoints go and its `succeeded` event is left there; a
        manifest a stopped upload's thread still writes is removed by the store's retention
        (daemon/store/pruning.py: the journal says succeeded)."""
        if self._worker is not None and not self._worker.done():
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            for unsent in (self._uploading, self._waiting[:2] if self._waiting else None):
                if unsent is not None:
                    await self._local(unsent[0], unsent[1], "the job succeeded before it was uploaded")
        self._waiting = self._uploading = None
        shutil.rmtree(self.staging, ignore_errors=True)
        if self.store is not None:
            try:
                if succeeded is not None:
                    await asyncio.to_thread(self.store.mark_succeeded, self.request_id, succeeded)
                await asyncio.to_thread(self.store.remove_checkpoints, self.request_id)
            except StoreError as exc:
                self.log.warning("checkpoint_store.settle_failed", error=str(exc))
