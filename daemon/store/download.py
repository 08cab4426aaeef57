"""A checkpoint of the store onto this host, where the trainer resumes from it: each name checked
again, each file read through `CheckpointStore.checked_path` (no link in a shared folder), written
into new files of a folder made for it (never through a link, never over a file), no further than
one byte past its listed size, checked against its sha256 as it is read, and only when the whole
checkpoint fits the disk with `FREE_MARGIN` to spare. Blocking, as the store is (a worker thread)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from daemon.store.checkpoints import CheckpointStore, Manifest, StoreError
from daemon.store.documents import Untrusted, safe_name, skipped
from daemon.store.host_checkpoints import bounded_copy, remove_folder, write_new

FREE_MARGIN = 2**30  # left free on the job's disk by a download


def download(store: CheckpointStore, request_id: str, manifest: Manifest, checkpoints: Path) -> Path:
    """The checkpoint into `checkpoints/checkpoint-<step>`; a StoreError when a file does not match
    its manifest, is not to be trusted or does not fit the disk (nothing is left behind then)."""
    name = f"checkpoint-{manifest.step}"
    partial = checkpoints / f"{name}.partial"
    remove_folder(partial)  # an earlier attempt's, or a link left in its place
    needed = sum(size for size, _ in manifest.files.values())
    try:
        partial.mkdir(parents=True)
        if shutil.disk_usage(partial).free < needed + FREE_MARGIN:
            raise StoreError(
                f"{manifest.url}: {needed} bytes do not fit {checkpoints}'s disk with {FREE_MARGIN} left free"
            )
        for relative, (size, digest) in manifest.files.items():
            target = partial.joinpath(*safe_name(relative).split("/"))  # checked again: a Manifest can be made by hand
            target.parent.mkdir(parents=True, exist_ok=True)
            with store.fs.open(store.checked_path(request_id, name, relative), "rb") as source:
                copied = bounded_copy(source, write_new(target), size)
            if copied != (size, digest):
                raise StoreError(f"{manifest.url}/{relative} does not match its manifest (size or sha256)")
    except Untrusted as exc:
        remove_folder(partial)
        skipped(exc, "manifest", request_id, manifest.step, manifest.url)
        raise StoreError(f"download of {manifest.url}: {exc}") from exc
    except StoreError:
        remove_folder(partial)
        raise
    except Exception as exc:
        remove_folder(partial)
        raise StoreError(f"download of {manifest.url}: {exc}") from exc
    target = checkpoints / name
    remove_folder(target)
    os.replace(partial, target)
    return target
