"""Every error adapterd raises on purpose, in one small hierarchy.

`code` values are part of the wire contract: they appear in `failed` events, and consumers branch
on them, so they never change meaning.
"""

from __future__ import annotations

from schemas import FieldError


class AdapterdError(Exception):
    """Base of every error adapterd raises on purpose."""


class ConfigError(AdapterdError):
    """The daemon's own settings are wrong; raised at start, before anything is consumed."""


class RequestRejected(AdapterdError):
    """A message that cannot become a job: not JSON, not valid against the schema, or outside policy."""

    def __init__(self, reason: str, errors: list[FieldError], request_id: str | None = None) -> None:
        self.reason = reason
        self.errors = errors
        self.request_id = request_id
        super().__init__(f"{reason}: " + "; ".join(f"{e.path}: {e.message}" for e in errors))


class JobFailed(AdapterdError):
    """A valid request whose job could not finish; becomes a `failed` event."""

    def __init__(self, code: str, stage: str, message: str, *, retryable: bool = False) -> None:
        self.code = code
        self.stage = stage
        self.message = message
        self.retryable = retryable
        super().__init__(f"{stage}/{code}: {message}")


class PushFailed(JobFailed):
    """The trained artifact could not be written to its sink; the artifact stays on disk."""

    def __init__(self, code: str, message: str, *, retryable: bool) -> None:
        super().__init__(code, "push", message, retryable=retryable)
