"""What the daemon hands a child process: the validated request, where to put things, and how to report.

Written by the parent as JSON into the job's folder; read by `handlers.runner` in the child, and
handed to the method's handler as it is.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, JsonValue

from schemas.common import Frozen


class JobSpec(Frozen):
    request: dict[str, JsonValue]
    checkpoints: Path = Field(description="Checkpoints of this request, kept across attempts: a redelivery resumes here.")
    artifact: Path = Field(description="What gets pushed: the adapter or model, the tokenizer and the model card.")
    progress_interval_s: float = Field(ge=0)
    progress_interval_steps: int = Field(1, ge=1)
    max_dataset_rows: int | None = Field(None, description="The operator's limit on training rows, for datasets whose size intake cannot see.")
    report_to: list[str] = Field(default_factory=list, description="TRL `report_to` integrations; empty means none.")
