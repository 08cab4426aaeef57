"""What a job trained on, as the child resolved it: each source's kind and location, the Hub commit
or each object's ETag and version, and every file with its size. Goes into `succeeded` and the model
card, so a result can be traced to the exact bytes it was trained on."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from .common import Frozen


class SourceFile(Frozen):
    path: str = Field(description="The file: a path inside the Hub repo, a URL, or a local path.")
    size: int | None = Field(None, description="Bytes, when the store says.")
    etag: str | None = Field(None, description="The object's ETag (object storage).")
    version_id: str | None = Field(None, description="The object's version id, on a versioned bucket.")


class ResolvedSource(Frozen):
    role: Literal["train", "eval"]
    kind: Literal["hub", "object_storage", "local", "inline"]
    location: str = Field(description="The Hub id, the URL or path as requested, or 'inline rows'.")
    revision: str | None = Field(None, description="The Hub commit sha the dataset resolved to.")
    split: str | None = None
    proportion: float | None = Field(None, description="This source's normalised share of a mixture.")
    files: list[SourceFile] = Field(default_factory=list)


class TrackedRun(Frozen):
    """Where a job's metrics went: a run in an experiment tracker the operator configured."""

    tracker: str = Field(description="TRL's report_to name of the tracker, e.g. 'mlflow'.")
    run_id: str
    url: str | None = Field(None, description="The run's page, when the tracker has one (MLflow's UI).")
    project: str | None = Field(
        None, description="The tracker's project the run is in, where it has them (Trackio's, training.project)."
    )
