"""Reading an event back: `parse_event`, strictly, as adapterd reads its own; `read_event`, as a consumer
reads any daemon's of schema_version 1 (fields it does not know dropped, types it does not know skipped),
its signature checked first when the fleet's keys are given.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from .events import EVENT_ADAPTER, Event
from .signing import EventKeys


def parse_event(raw: bytes) -> Event:
    """An event exactly as this version defines it: a field or a type it does not know raises.
    adapterd reads its own events with it; a consumer reads them with `read_event`."""
    return EVENT_ADAPTER.validate_json(raw)


# How many rounds `read_event` drops unknown fields for: each round drops every one pydantic names.
_MAX_ROUNDS = 8


def read_event(
    raw: bytes | str,
    *,
    keys: EventKeys | None = None,
    headers: Iterable[tuple[str, bytes | None]] | None = None,
) -> Event | None:
    """An event as a consumer reads it, whichever daemon of schema_version 1 wrote it (docs/events.md,
    "How the events change"): a field this version does not know, at any depth, is dropped; an event
    of a type it does not know is None, to be skipped; a broken event, or one of another
    schema_version, raises pydantic's ValidationError.

    With `keys` (the fleet's public keys, schemas.signing), the record's `headers` must carry a
    signature of one of them over exactly `raw`, checked before anything is parsed: an unsigned or
    wrongly signed event raises schemas.signing.UnverifiedEvent, to be counted and skipped."""
    if keys is not None:
        keys.verify(raw.encode() if isinstance(raw, str) else raw, headers)
    document = json.loads(raw)
    for _ in range(_MAX_ROUNDS):
        try:
            return EVENT_ADAPTER.validate_python(document)
        except ValidationError as exc:
            errors = exc.errors()
            if any(error["type"] == "union_tag_invalid" for error in errors):
                return None  # a newer daemon's event type
            unknown = [error["loc"] for error in errors if error["type"] == "extra_forbidden"]
            if not unknown or len(unknown) != len(errors):
                raise
            for location in unknown:
                _drop(document, location)
    return EVENT_ADAPTER.validate_python(document)


def _drop(document: Any, location: tuple[int | str, ...]) -> None:
    """Remove the field at `location` (pydantic's path; a union's branch names in it are skipped)."""
    *parents, name = location
    node = document
    for part in parents:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and part < len(node):
            node = node[part]
        # else: a tagged union's branch name (the event type), not a key of the document
    if isinstance(node, dict):
        node.pop(name, None)
