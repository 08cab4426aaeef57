"""What the daemon hands a child process: the validated request and where to put things.

Written by the parent as JSON into the job's folder; read by `handlers.runner` in the child.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import JsonValue

from schemas.common import Frozen


class JobSpec(Frozen):
    request: dict[str, JsonValue]
    checkpoints: Path
    artifact: Path
    progress_interval_s: float
