"""The operator's words for a Ray cluster (`[ray]`): where requests bigger than this host run, and how.

Absent (the default), nothing runs on Ray and a request asking more GPUs than the host has is rejected naming
`resources`. Set, such a request (up to `max_gpus`) is submitted to the cluster's Jobs API as one Ray job per run
(daemon/children/ray_jobs.py), supervised by this host beside its own jobs (`max_jobs` at once, on none of its GPUs).
The job's folder (its spec, checkpoints and artifact) is on `shared_dir`, a folder mounted at the same path on this
host and on every node of the cluster (NFS, a cluster filesystem): the ranks write there, and this host uploads the
checkpoints to the store, signs them and pushes the artifact, as for a local job. Nothing secret reaches a Ray worker
unless the operator says so (`pass_hub_token`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RaySettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str = Field(
        pattern=r"^https?://[^\s/]+(/[^\s]*)?$",
        max_length=2048,
        description="The cluster's Jobs API (its dashboard), e.g. http://ray-head:8265.",
    )
    shared_dir: Path = Field(
        description=(
            "A folder at this path on this host and on every node of the cluster (a shared filesystem): each Ray "
            "job's folder, its checkpoints and artifact, is <it>/<request id>."
        )
    )
    max_jobs: int = Field(1, ge=1, le=64, description="Ray jobs this host supervises at once, beside its own jobs.")
    max_gpus: int = Field(
        64, ge=1, le=4096, description="The most GPUs (ranks) a request sent to the cluster may ask for."
    )
    worker_resources: dict[str, float] = Field(
        default_factory=lambda: {"GPU": 1.0, "CPU": 8.0},
        max_length=16,
        description='Each rank\'s bundle of Ray resources ({"CPU": 1} on a cluster without GPUs).',
    )
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    placement_timeout_s: float = Field(
        900, gt=0, le=86_400, description="How long a job waits for room for all its ranks before its run fails."
    )
    stop_grace_s: float | None = Field(
        None,
        gt=0,
        le=86_400,
        description="How long a stopped Ray job may take to save its checkpoint (RAY_JOB_STOP_WAIT_TIME_S); "
        "unset: drain_timeout_s.",
    )
    python: str = Field(
        "python",
        max_length=4096,
        description="The Python of the cluster's nodes that has adapterd's training stack (the job's entrypoint).",
    )
    runtime_env: dict[str, object] = Field(
        default_factory=dict,
        description="Ray's runtime_env for the jobs (py_executable, image_uri, non-secret env_vars), passed on.",
    )
    pass_hub_token: bool = Field(
        False,
        description="Give the ranks the Hub token (for gated or private bases); Jobs API readers can read it.",
    )
    retry_s: float = Field(
        30, gt=0, le=3600, description="While the cluster is unreachable, how often the waiting job asks it again."
    )
