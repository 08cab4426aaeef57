"""What a request's job has reached, kept in its work folder across attempts and restarts.

`trained`: the child's result, written once the artifact is complete on disk, so a failed or
interrupted push is retried without training again. `succeeded`: the published event, so a
redelivered request is answered with it instead of a second training and a second commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        try:
            return dict(json.loads(self.path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def record(self, stage: str, value: Any) -> None:
        """Add a stage, atomically: a crash leaves the old journal or the new one, never half of one."""
        self._write({**self.read(), stage: value})

    def forget(self, stage: str) -> None:
        """Take a stage out (an earlier attempt's, about to be done again), as atomically."""
        entries = self.read()
        if entries.pop(stage, None) is not None:
            self._write(entries)

    def _write(self, entries: dict[str, Any]) -> None:
        write_atomically(self.path, entries)


def write_atomically(path: Path, value: Any) -> None:
    """`value` as JSON in `path`, through a partial file and a rename: a crash leaves the old file
    or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(value, indent=2))
    os.replace(partial, path)
