"""The operator's checkpoint store: every checkpoint a job saves, kept where any host can resume it.

`checkpoint_store` names it (s3://bucket/prefix, gs://, az://, or a shared folder), read and written
with fsspec, the dataset sources' `dataset_storage_options` for its scheme and the host's own
credentials. A request's checkpoints lie under `<store>/<request id>/checkpoint-<step>/`, each file
as the trainer wrote it, and `manifest.json` beside them, written LAST: it lists each file's size and
sha256. A checkpoint counts only with its manifest and files that match it, so an upload cut short
(a host lost mid-upload) or a file changed since is skipped for the one before it. A request that
succeeded keeps only `<store>/<request id>/succeeded.json`, its event: a host it is delivered to again
answers with it rather than training it again (the journal that says so is on the first host's disk).

Blocking (fsspec's calls are); the daemon runs these in worker threads (daemon/jobs/uploads.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from daemon.errors import AdapterdError

MANIFEST = "manifest.json"
SUCCEEDED = "succeeded.json"  # beside a succeeded request's (removed) checkpoints: its event, for idempotency across hosts
CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
CHUNK = 4 * 2**20
# Whatever a store's backend raises (s3fs, gcsfs and adlfs let their clients' own errors through) is a StoreError here:
# a store that fails must leave the job going on, not end it.


class StoreError(AdapterdError):
    """The checkpoint store could not be read or written, or held nothing whole to resume from."""


@dataclass(frozen=True)
class Manifest:
    """A complete checkpoint in the store: its step, where it is, and its files (relative path → size, sha256)."""

    step: int
    url: str
    files: dict[str, tuple[int, str]]
    written_at: float


def local_checkpoints(folder: Path) -> dict[int, Path]:
    """The trainer's checkpoint folders under `folder`, by step (as transformers' get_last_checkpoint finds them)."""
    if not folder.is_dir():
        return {}
    found = {int(match.group(1)): path for path in folder.iterdir() if (match := CHECKPOINT.match(path.name)) and path.is_dir()}
    return dict(sorted(found.items()))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


class CheckpointStore:
    """One store URL; every method raises StoreError for what the store did (down, refused, missing)."""

    def __init__(self, url: str, storage_options: dict[str, dict[str, Any]], host: str = "") -> None:
        scheme = url.split("://", 1)[0] if "://" in url else "file"
        self.url = url.rstrip("/")
        self.host = host
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options.get(scheme, {}))
        except (ImportError, ValueError) as exc:
            raise StoreError(f"checkpoint_store {url!r}: {exc}") from exc
        self.root = self.root.rstrip("/")

    def path(self, *parts: str) -> str:
        """A path in the store (without its scheme), as the store's file system names it."""
        return "/".join([self.root, *parts])

    def _url(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    def upload(self, request_id: str, folder: Path, step: int) -> Manifest:
        """Every file of `folder` under the request's checkpoint-<step>, then its manifest."""
        files = {str(path.relative_to(folder)): path for path in sorted(folder.rglob("*")) if path.is_file()}
        listed = {name: (path.stat().st_size, sha256(path)) for name, path in files.items()}
        name = f"checkpoint-{step}"
        try:
            for parent in sorted({str(Path(relative).parent) for relative in files}):  # a shared folder needs them; object stores ignore them
                self.fs.makedirs(self.path(request_id, name, parent).removesuffix("/."), exist_ok=True)
            for relative, path in files.items():
                self.fs.put_file(str(path), self.path(request_id, name, relative))
            manifest = {"step": step, "host": self.host, "written_at": time.time(),
                        "files": {relative: {"size": size, "sha256": digest} for relative, (size, digest) in listed.items()}}
            self.fs.pipe_file(self.path(request_id, name, MANIFEST), json.dumps(manifest, indent=2).encode())
        except Exception as exc:
            raise StoreError(f"upload of {name} of {request_id} to {self.url}: {exc}") from exc
        return Manifest(step, self._url(request_id, name), listed, manifest["written_at"])  # type: ignore[arg-type]

    def complete(self, request_id: str) -> list[Manifest]:
        """The request's checkpoints that are whole by their listing (manifest there, every file at its
        size), newest first; a partial one (no manifest, a file missing or of another size) is left out."""
        try:
            entries = self.fs.ls(self.path(request_id), detail=False) if self.fs.exists(self.path(request_id)) else []
        except Exception as exc:
            raise StoreError(f"listing {request_id} in {self.url}: {exc}") from exc
        steps = sorted((int(match.group(1)) for entry in entries if (match := CHECKPOINT.match(entry.rstrip("/").rsplit("/", 1)[-1]))),
                       reverse=True)
        found = []
        for step in steps:
            manifest = self._manifest(request_id, step)
            if manifest is not None:
                found.append(manifest)
        return found

    def _manifest(self, request_id: str, step: int) -> Manifest | None:
        name = f"checkpoint-{step}"
        try:
            raw = self.fs.cat_file(self.path(request_id, name, MANIFEST))
        except FileNotFoundError:
            return None  # an upload cut short before its manifest
        except Exception as exc:
            raise StoreError(f"reading {name} of {request_id} in {self.url}: {exc}") from exc
        try:
            listed = json.loads(raw)
            files = {str(relative): (int(entry["size"]), str(entry["sha256"])) for relative, entry in listed["files"].items()}
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # a manifest that is not one
        for relative, (size, _) in files.items():
            try:
                info = self.fs.info(self.path(request_id, name, relative))
            except FileNotFoundError:
                return None
            except Exception as exc:
                raise StoreError(f"reading {name} of {request_id} in {self.url}: {exc}") from exc
            if info.get("size") != size:
                return None
        return Manifest(step, self._url(request_id, name), files, float(listed.get("written_at", 0)))

    def download(self, request_id: str, manifest: Manifest, checkpoints: Path) -> Path:
        """The checkpoint into `checkpoints/checkpoint-<step>`, each file checked against its sha256; a
        StoreError when one does not match (nothing is left behind then)."""
        name = f"checkpoint-{manifest.step}"
        partial = checkpoints / f"{name}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        try:
            for relative, (size, digest) in manifest.files.items():
                target = partial / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self.path(request_id, name, relative), str(target))
                if target.stat().st_size != size or sha256(target) != digest:
                    raise StoreError(f"{manifest.url}/{relative} does not match its manifest (size or sha256)")
        except StoreError:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        except Exception as exc:
            shutil.rmtree(partial, ignore_errors=True)
            raise StoreError(f"download of {manifest.url}: {exc}") from exc
        target = checkpoints / name
        shutil.rmtree(target, ignore_errors=True)
        os.replace(partial, target)
        return target

    def mark_succeeded(self, request_id: str, event: dict[str, Any]) -> None:
        """The request's `succeeded` event, for any host it is delivered to again (a duplicate is answered with it)."""
        try:
            self.fs.makedirs(self.path(request_id), exist_ok=True)  # a shared folder needs it; object stores ignore it
            self.fs.pipe_file(self.path(request_id, SUCCEEDED), json.dumps(event).encode())
        except Exception as exc:
            raise StoreError(f"writing {SUCCEEDED} of {request_id} to {self.url}: {exc}") from exc

    def succeeded(self, request_id: str) -> dict[str, Any] | None:
        """The request's `succeeded` event as a host recorded it, None when none did."""
        try:
            return dict(json.loads(self.fs.cat_file(self.path(request_id, SUCCEEDED))))
        except FileNotFoundError:
            return None
        except ValueError:
            return None  # not one (cut short): the Hub commit, where there is one, still says it
        except Exception as exc:
            raise StoreError(f"reading {SUCCEEDED} of {request_id} in {self.url}: {exc}") from exc

    def remove_checkpoints(self, request_id: str) -> int:
        """Every checkpoint of the request (its `succeeded` stays); how many there were."""
        try:
            entries = self.fs.ls(self.path(request_id), detail=False) if self.fs.exists(self.path(request_id)) else []
            folders = [entry for entry in entries if CHECKPOINT.match(entry.rstrip("/").rsplit("/", 1)[-1])]
            for folder in folders:
                self.fs.rm(folder, recursive=True)
        except Exception as exc:
            raise StoreError(f"removing the checkpoints of {request_id} from {self.url}: {exc}") from exc
        return len(folders)

    def remove(self, request_id: str, step: int | None = None) -> None:
        """A request's checkpoints in the store (all of them, or the one of `step`)."""
        path = self.path(request_id) if step is None else self.path(request_id, f"checkpoint-{step}")
        try:
            if self.fs.exists(path):
                self.fs.rm(path, recursive=True)
        except Exception as exc:
            raise StoreError(f"removing {path} from {self.url}: {exc}") from exc

    def requests(self) -> list[str]:
        """The request ids with anything in the store."""
        try:
            if not self.fs.exists(self.root):
                return []
            return sorted(entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.root, detail=False))
        except Exception as exc:
            raise StoreError(f"listing {self.url}: {exc}") from exc
