"""Version 1 of the messages on `adapterd.control`, keyed by request id. Every daemon reads all of them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .common import REQUEST_ID_PATTERN, SCHEMA_VERSION, Frozen


class Cancel(Frozen):
    """Cancel a request: a running job stops within seconds and ends in `cancelled`; a request not yet
    started ends in `cancelled` when a daemon reaches it, without training."""

    schema_version: Literal[1] = SCHEMA_VERSION
    type: Literal["cancel"] = "cancel"
    request_id: str = Field(pattern=REQUEST_ID_PATTERN)
    reason: str = Field("", max_length=1000, description="Why, in words; echoed in the `cancelled` event.")
