"""Every error adapterd raises on purpose, in one small hierarchy:

    AdapterdError                  (schemas.common)
    ├── ConfigError                the daemon's own settings are wrong
    └── JobFailed                  (schemas.job) a job could not finish: a `failed` event
        └── PushFailed             the artifact could not be written to its sink

`code` values are part of the wire contract (`schemas.job.FailureCode`): they appear in `failed`
events, and consumers branch on them, so they never change meaning.
"""

from __future__ import annotations

from schemas.common import AdapterdError
from schemas.job import FailureCode, JobFailed

__all__ = ["AdapterdError", "ConfigError", "JobFailed", "PushFailed"]


class ConfigError(AdapterdError):
    """The daemon's own settings are wrong; raised at start, before anything is consumed."""


class PushFailed(JobFailed):
    """The trained artifact could not be written to its sink; the artifact stays on disk."""

    def __init__(self, code: FailureCode, message: str, *, retryable: bool) -> None:
        super().__init__(code, "push", message, retryable=retryable)
