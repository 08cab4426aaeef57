"""Building blocks shared by requests and events."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1

# A Hub repo id: "name" or "namespace/name" (HUB_ID inside other patterns, HUB_ID_PATTERN alone).
HUB_ID = r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?"
HUB_ID_PATTERN = rf"^{HUB_ID}$"
# A model: a Hub repo id, or an absolute local path that the operator allows.
MODEL_ID_PATTERN = rf"^(/\S+|{HUB_ID})$"

# An idempotency key: it names Hub commits, work directories and Kafka keys, so it stays path-safe;
# it may not start with a dot ("." and ".." would name the work folder or the jobs folder itself).
# A kind of GPU (`h100-80gb`, `a100-40gb`, `l4-24gb`: daemon/resources/kinds.py makes them from what nvidia-smi says),
# as requests, hosts and the operator name them: short, lower case, bounded.
GPU_KIND_PATTERN = r"^[a-z0-9][a-z0-9._-]{0,31}$"
REQUEST_ID_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"

# Every integer a request carries fits in 64 bits: Python's own ints have no bound, and a number of
# thousands of digits costs time to convert and overflows whatever it reaches (a timer, a tensor).
MAX_INT = 2**63 - 1


# What git's check-ref-format refuses in a branch name (and the Hub with it): control characters,
# space and ~^:?*[\\, an empty or dot-led component, "..", "@{", ".lock" at a component's end.
_REF_CHARACTERS = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def branch_problem(name: str) -> str | None:
    """Why `name` is not a branch name by git's ref rules, or None. A branch names a Hub ref and,
    on the local sink, a folder: "../x", "/abs" or "." must never get that far."""
    if name.startswith("refs/"):
        return "a branch name, not a ref path (refs/...)"
    return _ref_problem(name, "a branch name")


def revision_problem(name: str) -> str | None:
    """Why `name` is not a revision to read from the Hub (a branch, a tag, a commit sha, or a ref
    such as `refs/pr/1` or `refs/convert/parquet`) by git's ref rules, or None. huggingface_hub has
    no check of its own: it quotes a revision into the URL, and names a file of its cache after it
    (`refs/<revision>`), so "../x" must be refused here, naming the field."""
    return _ref_problem(name, "a revision")


def _ref_problem(name: str, what: str) -> str | None:
    if not name or len(name) > 255:
        return f"{what} of 1 to 255 characters"
    if _REF_CHARACTERS.search(name):
        return f"{what} has no spaces, control characters or any of ~^:?*[\\"
    if name.startswith(("-", "/")) or name.endswith(("/", ".")) or name == "@":
        return f"{what} does not start with '-' or '/', end with '/' or '.', or equal '@'"
    if ".." in name or "@{" in name or "//" in name:
        return f"{what} has no '..', '@{{' or '//'"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return f"no part of {what} starts with '.' or ends with '.lock'"
    return None


def _hub_revision(value: str | None) -> str | None:
    problem = None if value is None else revision_problem(value)
    if problem:
        raise ValueError(f"not a revision: {problem}")
    return value


# A revision a request reads a model or a dataset at, held to git's ref rules (`revision_problem`).
HubRevision = Annotated[str | None, AfterValidator(_hub_revision)]


class AdapterdError(Exception):
    """Base of every error adapterd raises on purpose (the daemon's and the child's)."""


class Frozen(BaseModel):
    """Base of every model read from or written to the outside world: immutable and strict about keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class FieldError(Frozen):
    """One reason a request was refused, named by the path of the offending field."""

    path: str = Field(
        description="Dotted path of the offending field, e.g. 'training.learning_rate'; '' for the whole message."
    )
    message: str = Field(description="What was wrong with it.")


# Why a message did not become a job; the `reason` of a `rejected` event and of a DLQ record.
RejectReason = Literal[
    "not_json",
    "not_an_object",
    "unknown_method",
    "unsupported_method",
    "invalid",
    "policy",
    "resources",
    "secret_in_request",  # a value that looks like a credential; the event names its path, never the value
    "internal",  # deciding about the record raised unexpectedly: a bug of adapterd's, dead-lettered rather than re-read
    # a record of the claims topic without the fleet's valid signature (daemon/kafka/queue_seal.py): never run
    "unverified_claim",
]


class RankProgress(Frozen):
    """One process of a job of several (a rank: one GPU's worker, data-parallel or sharded) at a progress report."""

    rank: int
    tokens_per_s: float | None = None  # the tokens of its own batches since the previous report; null on the first
    peak_bytes: int = (
        0  # its most memory so far: torch's allocator peak on its GPU, or on the CPU its peak resident set
    )


class TrainingProgress(Frozen):
    """Where a training run stands: what the child reports (`handlers.protocol.ProgressReport`) and a
    `progress` event carries (`schemas.events.Progress`), said once."""

    step: int
    total_steps: int
    epoch: float | None = None
    loss: float | None = None
    learning_rate: float | None = None
    grad_norm: float | None = None
    eta_s: float | None = None
    tokens_per_s: float | None = None
    # The online methods' (GRPO, RLOO, online DPO...) mean reward of the step's completions, as TRL logs it (`reward`):
    # the figure their users watch, where the loss says little (GRPO's starts at 0). Null for the other methods.
    reward: float | None = None
    # During the request's evaluation after training (stage `evaluate`): `step` stays the last
    # training step, and these say which model is being measured and how far its pass has come.
    stage: Literal["train", "evaluate"] = "train"
    evaluating: Literal["adapter", "base", "current"] | None = None
    eval_batch: int | None = None
    eval_batches: int | None = None
    # A job of several processes: each rank's figures (its tokens/s and peak memory), and the largest peak of them.
    ranks: list[RankProgress] | None = None
    peak_bytes: int | None = None
