"""The operator's checkpoint store: every checkpoint a job saves, kept where any host can resume it.

`checkpoint_store` names it (s3://bucket/prefix, gs://, az://, or a shared folder), read and written
with fsspec, the dataset sources' `dataset_storage_options` for its scheme and the host's own
credentials. A request's checkpoints lie under `<store>/<request id>/checkpoint-<step>/`, each file
as the trainer wrote it, and `manifest.json` beside them, written LAST: it lists each file's size and
sha256. A checkpoint counts only with its manifest and files that match it, so an upload cut short
(a host lost mid-upload) or a file changed since is skipped for the one before it. A request that
succeeded keeps only `<store>/<request id>/succeeded.json`, its event: a host it is delivered to again
answers with it rather than training it again (the journal that says so is on the first host's disk).

The store is a trust boundary (daemon/store/documents.py): the manifest and succeeded.json are
signed by the fleet and verified before use; a manifest's names are paths inside its checkpoint's
folder, checked before any download; no link is followed in a shared folder, nor written through on
this host (daemon/store/download.py); and what a manifest lists is bounded
(`checkpoint_store_max_bytes`, the disk's free space). Removing a request's checkpoints never
follows a link either: what a link names, elsewhere, is never emptied.

Blocking (fsspec's calls are); the daemon runs these in worker threads (daemon/job/uploads.py).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from daemon.errors import AdapterdError
from daemon.store.documents import (
    MAX_DOCUMENT_BYTES,
    Kind,
    StoreSigning,
    Untrusted,
    listed_files,
    safe_name,
    seal,
    skipped,
    unseal,
)
from daemon.store.host_checkpoints import CHECKPOINT, checkpoint_files, sha256
from schemas.common import REQUEST_ID_PATTERN

MANIFEST = "manifest.json"
SUCCEEDED = (
    "succeeded.json"  # beside a succeeded request's (removed) checkpoints: its event, for idempotency across hosts
)
REQUEST_ID = re.compile(REQUEST_ID_PATTERN)
DEFAULT_MAX_BYTES = (
    200 * 10**9
)  # checkpoint_store_max_bytes' default: a full fine-tune's optimizer state of a 7B model fits
LOOKED_AT = (
    64  # a request's newest checkpoints read for a whole one: a store cannot make a host read a million manifests
)
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


class CheckpointStore:
    """One store URL; every method raises StoreError for what the store did (down, refused, missing)."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, dict[str, Any]],
        host: str = "",
        *,
        signing: StoreSigning,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        scheme = url.split("://", 1)[0] if "://" in url else "file"
        self.url = url.rstrip("/")
        self.host = host
        self.signing = signing
        self.max_bytes = max_bytes
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **storage_options.get(scheme, {}))
        except (ImportError, ValueError) as exc:
            raise StoreError(f"checkpoint_store {url!r}: {exc}") from exc
        self.root = self.root.rstrip("/")
        # Only a shared folder has links; an object store's keys are names, never followed.
        self._links = isinstance(self.fs, LocalFileSystem)

    def path(self, *parts: str) -> str:
        """A path in the store (without its scheme), as the store's file system names it."""
        return "/".join([self.root, *parts])

    def _url(self, *parts: str) -> str:
        return "/".join([self.url, *parts])

    def checked_path(self, *parts: str) -> str:
        """The path of `parts`, or Untrusted("link") when a shared folder's path to it passes a link
        (the request's folder, the checkpoint's, or any of the file's): what a link names is
        outside what the fleet wrote. The store's own root may lie under links the operator made."""
        path = self.path(*parts)
        if self._links and os.path.realpath(path) != os.path.join(
            os.path.realpath(self.root), *"/".join(parts).split("/")
        ):
            raise Untrusted("link", f"{'/'.join(parts)[:120]!r} is or passes a link")
        return path

    def _read_document(self, kind: Kind, request_id: str, step: int | None, *parts: str) -> dict[str, Any]:
        """A signed document of the store, verified for `kind` of `request_id` at `step`; bounded in size."""
        raw = self.fs.cat_file(self.checked_path(request_id, *parts), start=0, end=MAX_DOCUMENT_BYTES + 1)
        return unseal(self.signing.keys, kind, request_id, step, raw)

    def upload(self, request_id: str, folder: Path, step: int) -> Manifest:
        """Every file of `folder` under the request's checkpoint-<step>, then its signed manifest."""
        files = checkpoint_files(folder)
        name = f"checkpoint-{step}"
        try:
            for relative in files:
                safe_name(relative)  # a name no host would take back is not uploaded either
        except Untrusted as exc:
            raise StoreError(f"upload of {name} of {request_id}: {exc}") from exc
        listed = {relative: (path.stat().st_size, sha256(path)) for relative, path in files.items()}
        try:
            for parent in sorted(
                {str(Path(relative).parent) for relative in files}
            ):  # a shared folder needs them; object stores ignore them
                self.fs.makedirs(self.path(request_id, name, parent).removesuffix("/."), exist_ok=True)
            for relative, path in files.items():
                self.fs.put_file(str(path), self.path(request_id, name, relative))
            manifest = {
                "step": step,
                "host": self.host,
                "written_at": time.time(),
                "files": {relative: {"size": size, "sha256": digest} for relative, (size, digest) in listed.items()},
            }
            self.fs.pipe_file(
                self.path(request_id, name, MANIFEST), seal(self.signing, "manifest", request_id, step, manifest)
            )
        except Exception as exc:
            raise StoreError(f"upload of {name} of {request_id} to {self.url}: {exc}") from exc
        return Manifest(step, self._url(request_id, name), listed, manifest["written_at"])  # type: ignore[arg-type]

    def complete(self, request_id: str) -> list[Manifest]:
        """The request's checkpoints that are whole by their listing (a manifest the fleet signed for
        this request and step, every file at its size), newest first; a partial one (no manifest, a
        file missing or of another size) is left out, and one not to be trusted is said and left out."""
        try:
            entries = (
                self.fs.ls(self.checked_path(request_id), detail=False) if self.fs.exists(self.path(request_id)) else []
            )
        except Untrusted as exc:
            skipped(exc, "manifest", request_id, None, self._url(request_id))
            return []
        except Exception as exc:
            raise StoreError(f"listing {request_id} in {self.url}: {exc}") from exc
        steps = sorted(
            (
                int(match.group(1))
                for entry in entries
                if (match := CHECKPOINT.match(entry.rstrip("/").rsplit("/", 1)[-1]))
            ),
            reverse=True,
        )
        found = []
        for step in steps[:LOOKED_AT]:
            try:
                manifest = self._manifest(request_id, step)
            except Untrusted as exc:
                skipped(exc, "manifest", request_id, step, self._url(request_id, f"checkpoint-{step}"))
                continue
            if manifest is not None:
                found.append(manifest)
        return found

    def _manifest(self, request_id: str, step: int) -> Manifest | None:
        name = f"checkpoint-{step}"
        try:
            document = self._read_document("manifest", request_id, step, name, MANIFEST)
        except FileNotFoundError:
            return None  # an upload cut short before its manifest
        except Untrusted:
            raise
        except Exception as exc:
            raise StoreError(f"reading {name} of {request_id} in {self.url}: {exc}") from exc
        files = listed_files(document, self.max_bytes)
        for relative, (size, _) in files.items():
            try:
                info = self.fs.info(self.checked_path(request_id, name, relative))
            except FileNotFoundError:
                return None
            except Untrusted:
                raise
            except Exception as exc:
                raise StoreError(f"reading {name} of {request_id} in {self.url}: {exc}") from exc
            if info.get("islink"):
                raise Untrusted("link", f"{relative[:120]!r} is a link")
            if info.get("size") != size or info.get("type", "file") != "file":
                return None
        written_at = document.get("written_at")
        return Manifest(
            step, self._url(request_id, name), files, float(written_at) if isinstance(written_at, int | float) else 0.0
        )

    def mark_succeeded(self, request_id: str, event: dict[str, Any]) -> None:
        """The request's `succeeded` event, signed, for any host it is delivered to again (a
        duplicate is answered with it)."""
        try:
            self.fs.makedirs(self.path(request_id), exist_ok=True)  # a shared folder needs it; object stores ignore it
            self.fs.pipe_file(
                self.path(request_id, SUCCEEDED), seal(self.signing, "succeeded", request_id, None, event)
            )
        except Exception as exc:
            raise StoreError(f"writing {SUCCEEDED} of {request_id} to {self.url}: {exc}") from exc

    def succeeded(self, request_id: str) -> dict[str, Any] | None:
        """The request's `succeeded` event as a host of the fleet signed it; None when there is none,
        or one not to be trusted (said and counted: the journal and the Hub commit still say it)."""
        try:
            event = self._read_document("succeeded", request_id, None, SUCCEEDED)
            if event.get("type") != "succeeded" or event.get("request_id") != request_id:
                raise Untrusted("malformed", f"not the succeeded event of {request_id!r}")
            return event
        except FileNotFoundError:
            return None
        except Untrusted as exc:
            skipped(exc, "succeeded", request_id, None, self._url(request_id, SUCCEEDED))
            return None
        except Exception as exc:
            raise StoreError(f"reading {SUCCEEDED} of {request_id} in {self.url}: {exc}") from exc

    def remove_checkpoints(self, request_id: str) -> int:
        """Every checkpoint of the request (its `succeeded` stays); how many there were. A request's
        folder that is a link is removed as a link: what it names, elsewhere, is never emptied."""
        try:
            if self._is_link(self.path(request_id)):
                self._rm(self.path(request_id))
                return 0
            entries = self.fs.ls(self.path(request_id), detail=False) if self.fs.exists(self.path(request_id)) else []
            folders = [entry for entry in entries if CHECKPOINT.match(entry.rstrip("/").rsplit("/", 1)[-1])]
            for folder in folders:
                self._rm(folder)
        except Exception as exc:
            raise StoreError(f"removing the checkpoints of {request_id} from {self.url}: {exc}") from exc
        return len(folders)

    def remove(self, request_id: str, step: int | None = None) -> None:
        """A request's checkpoints in the store (all of them, or the one of `step`)."""
        path = self.path(request_id) if step is None else self.path(request_id, f"checkpoint-{step}")
        try:
            if self._is_link(path) or self.fs.exists(path):
                self._rm(path)
        except Exception as exc:
            raise StoreError(f"removing {path} from {self.url}: {exc}") from exc

    def _is_link(self, path: str) -> bool:
        return self._links and os.path.islink(path)

    def _rm(self, path: str) -> None:
        """`path` and what is under it; a link in a shared folder is removed itself, never followed."""
        if self._is_link(path):
            os.unlink(path)
        else:
            self.fs.rm(
                path, recursive=True
            )  # a shared folder's: shutil.rmtree, which removes links inside, never follows them

    def requests(self) -> list[str]:
        """The request ids with anything in the store."""
        try:
            if not self.fs.exists(self.root):
                return []
            names = (entry.rstrip("/").rsplit("/", 1)[-1] for entry in self.fs.ls(self.root, detail=False))
            return sorted(
                name for name in names if REQUEST_ID.fullmatch(name)
            )  # no other name is a request's, nor '.' or '..'
        except Exception as exc:
            raise StoreError(f"listing {self.url}: {exc}") from exc
