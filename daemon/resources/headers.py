"""Reading a model's safetensors headers (8 bytes of little-endian length, then that much JSON) for
the memory estimate, in reads that end by a deadline: a read that does not answer gives its thread
back when the deadline passes instead of holding it (issue 46). Each function here runs in a thread
of the `headers` pool (daemon/executors.py); daemon/resources/estimator.py starts them.

- A local file is opened without blocking and read only when it is a regular file: a FIFO under an
  allowed root, whose `open` would wait for a writer for ever, is refused at once.
- A Hub file is read by a streaming GET whose socket timeout is what is left of the deadline, and
  whose bytes are checked against the deadline as they come: a Hub that trickles them ends too.
- Only a header's bytes are read, never the weights behind it: at most safetensors' own 100 MiB.

A read the kernel blocks on a regular file (a network filesystem that hangs) cannot be ended from
Python: that thread stays taken, and only the `headers` pool's.
"""

from __future__ import annotations

import json
import os
import stat
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from daemon.resources.memory import Tensors, WeightsUnreadable

MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on a header
MAX_INDEX_BYTES = 16 * 2**20  # model.safetensors.index.json: a name a tensor
MAX_SHARDS = 10_000
CHUNK_BYTES = 2**20
SINGLE, INDEX = "model.safetensors", "model.safetensors.index.json"  # as transformers saves them

T = TypeVar("T")


@dataclass(frozen=True)
class Deadline:
    """When reads for one estimate must have ended (time.monotonic())."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds)

    def left(self, what: str) -> float:
        """The seconds left; WeightsUnreadable naming `what` once there are none."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise WeightsUnreadable(f"{what}: not read in time")
        return left


def header_from(chunks: Iterable[bytes], name: str, deadline: Deadline) -> dict[str, Any]:
    """A header from a file's first bytes, as they come; stops reading once it has the header."""
    data = bytearray()
    length: int | None = None
    for chunk in chunks:
        deadline.left(name)
        data += chunk
        if length is None and len(data) >= 8:
            (length,) = struct.unpack("<Q", data[:8])
            if length > MAX_HEADER_BYTES:
                raise WeightsUnreadable(f"{name}: a header of {length} bytes")
        if length is not None and len(data) >= 8 + length:
            break
    if length is None or len(data) < 8 + length:
        raise WeightsUnreadable(f"{name}: shorter than a safetensors header")
    try:
        header = json.loads(bytes(data[8 : 8 + length]))
    except ValueError as exc:  # not JSON, not UTF-8, or a number past Python's 4,300 digits
        raise WeightsUnreadable(f"{name}: its header is not JSON") from exc
    if not isinstance(header, dict):
        raise WeightsUnreadable(f"{name}: its header is not a JSON object")
    return header


def local_files(folder: Path) -> list[Path]:
    """A local model's safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsUnreadable(f"no safetensors files in {folder}")
    return files


def read_header(path: Path, deadline: Deadline | None = None) -> dict[str, Any]:
    """One local file's header; refused at once when the file is not a regular file."""
    deadline = deadline or Deadline.after(60)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO opens at once, writer or not
    except OSError as exc:
        raise WeightsUnreadable(f"{path.name}: {exc.strerror}") from exc
    with os.fdopen(fd, "rb", buffering=0) as file:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise WeightsUnreadable(f"{path.name}: not a regular file")
        return header_from(iter(partial(file.read, CHUNK_BYTES), b""), path.name, deadline)


def local_tensors(folder: Path, deadline: Deadline | None = None) -> Tensors:
    """A local model's tensors, its files read one after another (for benchmarks and tests; the
    daemon reads them at once, daemon/resources/estimator.py)."""
    deadline = deadline or Deadline.after(60)
    return Tensors.from_headers([read_header(path, deadline) for path in local_files(folder)]).warm()


@dataclass(frozen=True)
class HubModel:
    """A model on the Hub at a revision, whose files are read with the daemon's token."""

    endpoint: str
    model_id: str
    revision: str | None
    token: str | None

    def header(self, filename: str, deadline: Deadline) -> dict[str, Any]:
        """One file's header (WeightsUnreadable when the file is not there)."""
        found = self._read(
            filename, deadline, MAX_HEADER_BYTES + 8, lambda chunks: header_from(chunks, filename, deadline)
        )
        if found is None:
            raise WeightsUnreadable(f"{self.model_id}: no {filename}")
        return found

    def single_or_shards(self, deadline: Deadline) -> dict[str, Any] | list[str]:
        """The header of the model's one file, or the names of its shards from its index."""
        single = self._read(
            SINGLE, deadline, MAX_HEADER_BYTES + 8, lambda chunks: header_from(chunks, SINGLE, deadline)
        )
        if single is not None:
            return single
        index = self._read(
            INDEX, deadline, MAX_INDEX_BYTES, lambda chunks: _bounded(chunks, INDEX, deadline, MAX_INDEX_BYTES)
        )
        if index is None:
            raise WeightsUnreadable(f"{self.model_id}: neither {SINGLE} nor {INDEX}")
        try:
            weight_map = json.loads(index)["weight_map"]
            shards = sorted({str(shard) for shard in weight_map.values()})
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise WeightsUnreadable(f"{self.model_id}: its {INDEX} has no weight_map") from exc
        if not shards or len(shards) > MAX_SHARDS or any(not _plain(shard) for shard in shards):
            raise WeightsUnreadable(
                f"{self.model_id}: its {INDEX} names {len(shards)} shard(s), not safetensors files of the repo"
            )
        return shards

    def _read(self, filename: str, deadline: Deadline, limit: int, take: Callable[[Iterable[bytes]], T]) -> T | None:
        """`take` of the file's first `limit` bytes as they stream in; None when the Hub has no such file."""
        url = hf_hub_url(self.model_id, filename, revision=self.revision, endpoint=self.endpoint)
        headers = {**build_hf_headers(token=self.token), "range": f"bytes=0-{limit - 1}"}
        with get_session().stream(
            "GET", url, headers=headers, timeout=deadline.left(filename), follow_redirects=True
        ) as response:
            if response.status_code == 404:
                return None
            if response.status_code >= 400:
                response.read()
                hf_raise_for_status(response)
            return take(response.iter_bytes(CHUNK_BYTES))


def _plain(shard: str) -> bool:
    """A safetensors file of the repo, by a relative path that stays in it."""
    return shard.endswith(".safetensors") and not shard.startswith("/") and ".." not in shard.split("/")


def _bounded(chunks: Iterable[bytes], name: str, deadline: Deadline, limit: int) -> bytes:
    data = bytearray()
    for chunk in chunks:
        deadline.left(name)
        data += chunk
        if len(data) > limit:
            raise WeightsUnreadable(f"{name}: larger than {limit} bytes")
    return bytes(data)
