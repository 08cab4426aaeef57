"""A request's place in a pipeline (issue 63): the requests it waits for (`after`, each must have succeeded before it
starts, as SLURM's `--dependency=afterok`) and the one whose published result it starts from (`start_from`). TRL has
no field for this: these are adapterd's own. Checked here, at decoding, is what the request alone says (its own id,
duplicates, a start not among `after`); whether each id is known to the fleet is the daemon's to judge
(daemon/jobs/prerequisites.py)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from .common import REQUEST_ID_PATTERN

# The most requests one request waits for: each is read by its key when the request is reached, a bounded cost.
MAX_AFTER = 16

AfterIds = Annotated[
    list[Annotated[str, Field(pattern=REQUEST_ID_PATTERN)]],
    Field(
        max_length=MAX_AFTER,
        description=(
            f"The request ids this request waits for (at most {MAX_AFTER}, each once, not its own): it starts only "
            "once each has succeeded, and ends failed (prerequisite_failed) when one failed, was cancelled or was "
            "rejected. Each must be known to the fleet (docs/requests.md, Pipelines)."
        ),
    ),
]

START_FROM_DESCRIPTION = (
    "One of `after` whose published result this request starts from: an adapter is loaded on `model` (the same base "
    "it was trained on) as the adapter to train (and, for methods with a reference, as the reference); a merged model "
    "replaces `model.id`/`model.revision` with its repo at its commit. Absent: the request starts from `model` alone."
)


# The methods whose handlers load a start (handlers/toolkit/start_from.py), each checked by a test; another method's
# request naming one is refused rather than trained from the bare base.
STARTS_FROM_METHODS = frozenset({"sft", "dpo", "grpo"})


def chain_problem(request_id: str, method: str, after: list[str], start_from: str | None) -> str | None:
    """Why `after` and `start_from` cannot be as given, naming the field first ("after: ..."), or None."""
    if request_id in after:
        return f"after: names the request itself ({request_id!r}); a request cannot wait for itself"
    seen: set[str] = set()
    for each in after:
        if each in seen:
            return f"after: {each!r} is named twice"
        seen.add(each)
    if start_from is not None and method not in STARTS_FROM_METHODS:
        return f"start_from: offered for {', '.join(sorted(STARTS_FROM_METHODS))}, not for method {method} yet"
    if start_from is not None and start_from not in seen:
        return f"start_from: {start_from!r} is not among after {after}; a request starts only from one it waits for"
    return None
