"""Retry state on a request sent back to its topic: which attempt it is and when it is due, signed
with a key the hosts hold, so that a producer cannot set it.

A retry travels as the request's own bytes with three headers: `adapterd-attempt`,
`adapterd-not-before` (seconds since the epoch) and `adapterd-retry-signature`, an HMAC-SHA256 over
both values, the key and the bytes of the record. A record whose signature is missing or wrong is
read as a first attempt due now, whatever its headers say (a producer's `adapterd-attempt: 99`
would switch retries off, `adapterd-not-before: inf` would hold its partition for ever), and a
due time further ahead than the longest backoff is brought back to it.

The key is `retry_key_file` (one key for the fleet: a retry may be read by any host of the group),
else one made on first start in `work_dir/retry-key` (this host's retries only). With priority classes a
daemon does not start without `retry_key_file` (daemon/fleet/wiring.py: a request and its counts move
between hosts); `adapterd doctor` says its id (`retry_key_id`) to compare across the hosts.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from daemon.kafka.records import Record

log = structlog.get_logger()

ATTEMPT_HEADER = "adapterd-attempt"
DUE_HEADER = "adapterd-not-before"
SIGNATURE_HEADER = "adapterd-retry-signature"
ALONE_HEADER = "adapterd-alone"  # "1": it ran out of memory on a shared GPU and runs again on a GPU of its own
RETRY_HEADERS = (ATTEMPT_HEADER, DUE_HEADER, SIGNATURE_HEADER)
# How often the fleet has preempted the request (daemon/fleet/claimed.py), signed the same way: a producer's
# `adapterd-preemptions: 99` would make its request one that is never preempted again.
PREEMPTIONS_HEADER = "adapterd-preemptions"
PREEMPTIONS_SIGNATURE_HEADER = "adapterd-preemptions-signature"
MAX_BACKOFF_S = 3600.0  # the longest wait before a retry (`backoff_s`)


def backoff_s(base_s: float, attempt: int) -> float:
    """The wait before `attempt` (2, 3, ...): `base_s` (retry_backoff_s), doubled for each
    later try, at most an hour."""
    return min(base_s * 2 ** (attempt - 2), MAX_BACKOFF_S)


@dataclass(frozen=True)
class RetryState:
    attempt: int  # 1 for a first try
    due: float | None  # time.time() before which it does not run; None for a first try
    alone: bool = False  # runs on a GPU of its own (daemon/resources/slots.py), whatever its estimate


FIRST = RetryState(1, None)


class RetrySigner:
    def __init__(self, key: bytes, max_attempts: int) -> None:
        self.key = key
        self.max_attempts = max_attempts

    @classmethod
    def from_settings(cls, key_file: Path | None, work_dir: Path, max_attempts: int) -> RetrySigner:
        return cls(load_key(key_file, work_dir), max_attempts)

    def headers(
        self, record_key: bytes | None, value: bytes, attempt: int, due: float, *, alone: bool = False
    ) -> list[tuple[str, bytes]]:
        attempt_text, due_text = str(attempt).encode(), f"{due:.3f}".encode()
        alone_text = b"1" if alone else None
        return [
            (ATTEMPT_HEADER, attempt_text),
            (DUE_HEADER, due_text),
            *([(ALONE_HEADER, b"1")] if alone else []),
            (SIGNATURE_HEADER, self._sign(record_key, value, attempt_text, due_text, alone_text).encode()),
        ]

    def read(self, record: Record) -> RetryState:
        """The record's retry state, when the daemon signed it; a first try otherwise."""
        headers = {name: value for name, value in record.headers or () if name in (*RETRY_HEADERS, ALONE_HEADER)}
        if not headers:
            return FIRST
        attempt_text, due_text, signature = (headers.get(name, b"") for name in RETRY_HEADERS)
        alone_text = headers.get(ALONE_HEADER)
        # A null value (Kafka allows one) is never the daemon's: it signs bytes.
        if (
            attempt_text is None
            or due_text is None
            or signature is None
            or (ALONE_HEADER in headers and alone_text is None)
            or not hmac.compare_digest(
                self._sign(record.key, record.value or b"", attempt_text, due_text, alone_text).encode(), signature
            )
        ):
            log.warning(
                "retry.unsigned_headers",
                partition=record.partition,
                offset=record.offset,
                headers=sorted(headers),
                reason="read as a first attempt, due now",
            )
            return FIRST
        try:
            attempt, due = int(attempt_text), float(due_text)
        except ValueError:
            return FIRST
        if not (1 <= attempt <= self.max_attempts and math.isfinite(due)):
            return FIRST
        return RetryState(attempt, min(due, time.time() + MAX_BACKOFF_S), alone=alone_text == b"1")

    def preemption_headers(self, record_key: bytes | None, value: bytes, count: int) -> list[tuple[str, bytes]]:
        """Headers that say the request has been preempted `count` times, signed over the record."""
        text = str(count).encode()
        return [
            (PREEMPTIONS_HEADER, text),
            (PREEMPTIONS_SIGNATURE_HEADER, self._sign(record_key, value, b"preemptions", text).encode()),
        ]

    def preemptions(self, record: Record) -> int:
        """How often the fleet has preempted the request: 0 unless the count is signed."""
        headers = {
            name: value
            for name, value in record.headers or ()
            if name in (PREEMPTIONS_HEADER, PREEMPTIONS_SIGNATURE_HEADER)
        }
        text, signature = headers.get(PREEMPTIONS_HEADER), headers.get(PREEMPTIONS_SIGNATURE_HEADER)
        if not text or not signature or not text.isdigit() or len(text) > 6:
            return 0
        expected = self._sign(record.key, record.value or b"", b"preemptions", text).encode()
        return int(text) if hmac.compare_digest(expected, signature) else 0

    def _sign(
        self, record_key: bytes | None, value: bytes, attempt: bytes, due: bytes, alone: bytes | None = None
    ) -> str:
        """HMAC over the record and its retry state; `alone` only when set, so a retry signed before
        it existed reads the same."""
        mac = hmac.new(self.key, digestmod=hashlib.sha256)
        for part in (
            record_key or b"",
            hashlib.sha256(value).digest(),
            attempt,
            due,
            *([alone] if alone is not None else []),
        ):
            mac.update(len(part).to_bytes(8, "big") + part)  # length-prefixed: no two splits sign alike
        return mac.hexdigest()


def retry_key_id(key: bytes) -> str:
    """A short id of a retry key that says nothing of the key: equal on two hosts when their keys are."""
    return hashlib.sha256(b"adapterd retry key id\0" + key).hexdigest()[:16]


def load_key(key_file: Path | None, work_dir: Path) -> bytes:
    """The operator's key file, else this host's own, made once (mode 0600) in the work folder."""
    if key_file is not None:
        key = key_file.read_bytes().strip()
        if len(key) < 16:
            raise ValueError(f"retry_key_file {key_file}: a key of at least 16 bytes")
        return key
    path = work_dir / "retry-key"
    if not path.exists():
        work_dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # another daemon of this host made it first
            pass
        else:
            with os.fdopen(fd, "wb") as handle:
                handle.write(secrets.token_hex(32).encode())
    return path.read_bytes().strip()
