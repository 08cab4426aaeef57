"""Building blocks shared by requests and events."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

# A Hub repo id: "name" or "namespace/name" (HUB_ID inside other patterns, HUB_ID_PATTERN alone).
HUB_ID = r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?"
HUB_ID_PATTERN = rf"^{HUB_ID}$"

# An idempotency key: it names Hub commits, work directories and Kafka keys, so it stays path-safe.
REQUEST_ID_PATTERN = r"^[A-Za-z0-9._-]{1,128}$"


class AdapterdError(Exception):
    """Base of every error adapterd raises on purpose (the daemon's and the child's)."""


class Frozen(BaseModel):
    """Base of every model read from or written to the outside world: immutable and strict about keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class FieldError(Frozen):
    """One reason a request was refused, named by the path of the offending field."""

    path: str = Field(description="Dotted path of the offending field, e.g. 'training.learning_rate'; '' for the whole message.")
    message: str = Field(description="What was wrong with it.")


# Why a message did not become a job; the `reason` of a `rejected` event and of a DLQ record.
RejectReason = Literal[
    "not_json", "not_an_object", "unknown_method", "unsupported_method", "invalid", "policy", "resources",
    "secret_in_request",  # a value that looks like a credential; the event names its path, never the value
]


class TrainingProgress(Frozen):
    """Where a training run stands: what the child reports (`schemas.job.ProgressReport`) and a
    `progress` event carries (`schemas.events.Progress`), said once."""

    step: int
    total_steps: int
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    eta_s: float | None = None
    tokens_per_s: float | None = None
