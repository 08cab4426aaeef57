"""Version 1 of the messages on `adapterd.control`, keyed by request id. Every daemon reads all of them.

`Control` is any of them, told apart by `type`: a cancel, or a hold, release, pause or resume. A hold or a pause lasts
until a later release or resume of the same request (a resume is a release: the two are one), as long as the daemons
still read it (`control_lookback_s`); a cancel outranks them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter

from .common import REQUEST_ID_PATTERN, SCHEMA_VERSION, Frozen


class Cancel(Frozen):
    """Cancel a request: a running job stops within seconds and ends in `cancelled`; a request not yet
    started ends in `cancelled` when a daemon reaches it, without training."""

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["cancel"] = "cancel"
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = Field("", max_length=1000, description="Why, in words; echoed in the `cancelled` event.")


class Hold(Frozen):
    """Hold a waiting request: it is not started until a release (the requests behind it go first); a running job
    is left to run (a pause stops it)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["hold"] = "hold"
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = Field("", max_length=1000, description="Why, in words; echoed in the `held` event.")


class Release(Frozen):
    """Release a held or paused request: it waits again as any other, and starts (a paused one resumes from its
    checkpoint) when it is reached."""

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["release"] = "release"
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = Field("", max_length=1000, description="Why, in words; echoed in the `released` event.")


class Pause(Frozen):
    """Pause a request: a running job is stopped at a checkpoint (as a daemon stop does, no attempt spent) and its
    request waits held; a waiting one is held."""

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["pause"] = "pause"
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = Field("", max_length=1000, description="Why, in words; echoed in the `paused` or `held` event.")


class Resume(Frozen):
    """Resume a paused request: the same as a release; the next host to reach it resumes from its checkpoint."""

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["resume"] = "resume"
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = Field("", max_length=1000, description="Why, in words; echoed in the `released` event.")


def _control_type(value: Any) -> str | None:
    """A message's `type`, "cancel" when it has none (the one message before there were others, which a producer may
    still send without one); None for one that is not a string (a list: invalid, not unhashable)."""
    kind = value.get("type", "cancel") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if isinstance(kind, str) else None


Control = Annotated[
    Annotated[Cancel, Tag("cancel")]
    | Annotated[Hold, Tag("hold")]
    | Annotated[Release, Tag("release")]
    | Annotated[Pause, Tag("pause")]
    | Annotated[Resume, Tag("resume")],
    Discriminator(
        _control_type,
        custom_error_type="control_type",
        custom_error_message="type: not one of 'cancel', 'hold', 'release', 'pause', 'resume'",
    ),
]
CONTROL_ADAPTER: TypeAdapter[Control] = TypeAdapter(Control)
