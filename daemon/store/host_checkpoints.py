"""A host's side of its checkpoints: the trainer's checkpoint folders, the files of one as they are
uploaded, and the writes of a download, which go into new files only, never through a link and never
past a file's listed size (daemon/store/checkpoints.py reads the store's side)."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path
from typing import IO

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
CHUNK = 4 * 2**20


def local_checkpoints(folder: Path) -> dict[int, Path]:
    """The trainer's checkpoint folders under `folder`, by step (as transformers' get_last_checkpoint finds them)."""
    if not folder.is_dir():
        return {}
    found = {
        int(match.group(1)): path
        for path in folder.iterdir()
        if (match := CHECKPOINT.match(path.name)) and path.is_dir()
    }
    return dict(sorted(found.items()))


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def checkpoint_files(folder: Path) -> dict[str, Path]:
    """The files of a saved checkpoint by their '/'-separated names in it; a link (to a file or a
    folder) is left out, so nothing outside the folder (a key, a secret) is ever uploaded through one."""
    found = {}
    for parent, _, names in os.walk(folder):  # os.walk does not descend into linked folders
        for name in names:
            path = Path(parent) / name
            if path.is_file() and not path.is_symlink():
                found[path.relative_to(folder).as_posix()] = path
    return dict(sorted(found.items()))


def write_new(target: Path) -> int:
    """A new file's descriptor: never through a link, never over a file already there."""
    return os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)  # POSIX only


def bounded_copy(source: IO[bytes], descriptor: int, size: int) -> tuple[int, str]:
    """`source` into the file `descriptor` (closed after), reading at most one byte past `size`: the
    bytes copied and their sha256, so a file longer than its manifest says never fills the disk."""
    digest, copied = hashlib.sha256(), 0
    with os.fdopen(descriptor, "wb") as target:
        while copied <= size and (chunk := source.read(min(CHUNK, size + 1 - copied))):
            copied += len(chunk)
            digest.update(chunk)
            target.write(chunk)
    return copied, digest.hexdigest()


def remove_folder(path: Path) -> None:
    """A folder of this host's and what is in it; a link in its place is removed, never followed."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
