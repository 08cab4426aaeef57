"""The settings of how this host runs jobs, a mixin of `daemon.settings.Settings` (its `ADAPTERD_*`
variables and TOML keys are those of every other setting, and its fields follow the Kafka ones, as
they always have): its work folder, slots and GPUs (packing, speed settings), how a job's child
starts and what it is given, progress, retries, stalls and draining, job folders' retention and the
checkpoint store."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from schemas.common import GPU_KIND_PATTERN

# The object stores a checkpoint_store URL may name (s3fs, gcsfs, adlfs), besides a shared folder.
CHECKPOINT_STORE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs")


class WorkSettings(BaseModel):
    """The jobs on this host; a child_env entry that is no variable's name (or names the daemon's own
    settings), or a checkpoint_store that is no store's URL nor an absolute folder, is refused naming the setting."""

    work_dir: Path = Path("/var/lib/adapterd")
    gpus: list[str] | None = Field(
        None, description="GPU ids jobs may use; unset: $CUDA_VISIBLE_DEVICES, else nvidia-smi; [] for none."
    )
    job_slots: int = Field(
        1, ge=1, le=64, description="Jobs run at once on a host without GPUs (with GPUs: one slot per GPU)."
    )
    max_jobs_per_gpu: int = Field(
        1,
        ge=1,
        le=16,
        description=(
            "One-GPU jobs placed on one GPU at once while their memory estimates fit (daemon/resources/slots.py); "
            "1, the default: every job has a whole GPU."
        ),
    )
    gpu_memory_headroom: float = Field(
        0.1,
        ge=0,
        lt=1,
        description=(
            "The share of each GPU's memory no job takes: not packed (max_jobs_per_gpu > 1), nor planned on (a job's "
            "memory plan: a whole copy, sharded, or rejected; daemon/resources/shards.py)."
        ),
    )
    gpu_memory_bytes: int | None = Field(
        None,
        ge=1,
        description=(
            "Each GPU's memory, for packing and for each job's memory plan; unset: what nvidia-smi "
            "says (no plan without either)."
        ),
    )
    # What requests may ask of the GPUs (resources.gpu_kind, min_gpu_memory_gib; daemon/resources/kinds.py).
    gpu_kind: str | None = Field(
        None,
        pattern=GPU_KIND_PATTERN,
        description=(
            "This host's kind of GPU, as requests name it (resources.gpu_kind); unset: made from nvidia-smi's name and "
            "memory ('h100-80gb', 'a100-40gb', 'l4-24gb'). A host without GPUs has none."
        ),
    )
    gpu_kinds: dict[str, float] = Field(
        default_factory=dict,
        description=(
            "The fleet's kinds of GPU and each one's memory in GiB, the same on every host, e.g. "
            '{"a100-40gb" = 40, "h100-80gb" = 80, "l4-24gb" = 24}: a request no kind of them serves is rejected at '
            "once; empty: a host knows only its own kind."
        ),
    )
    # The host's speed settings (handlers/toolkit/fast.py), each off by default; a request's own field always wins.
    gradient_checkpointing_when_needed: bool = Field(
        False,
        description=(
            "TRL turns gradient checkpointing on for every job (about 20% slower, its help says); with this, a job on "
            "a whole GPU whose memory estimate without it fits the GPU trains without it."
        ),
    )
    fastest_attention: bool = Field(
        False, description="Models load with flash attention where the host can run it, else sdpa."
    )
    liger_kernel: bool = Field(
        False, description="Liger's kernels (training.use_liger_kernel) where liger_kernel is installed."
    )
    warm_child: bool = Field(
        True, description="Start jobs warm: the training stack imported ahead of the job (child_start says how)."
    )
    child_start: Literal["fork", "spawn"] = Field(
        "fork",
        description=(
            "With warm_child: 'fork' forks every one-GPU job's child from a server that imported the training stack "
            "once (every start warm, CUDA untouched in the server); 'spawn' starts a fresh interpreter per job, one "
            "ahead per free slot (only a slot's first job after a pause starts warm)."
        ),
    )
    child_env: list[str] = Field(
        default_factory=list,
        description=(
            "Further variables of the daemon's environment every job's child gets, by name or by prefix ending in '*' "
            "(FOO_*), beyond what daemon/children/environment.py passes on; anything listed reaches every job's code."
        ),
    )
    progress_interval_s: float = Field(
        10.0, ge=0, description="Progress events of a job at least this many seconds apart..."
    )
    progress_interval_steps: int = Field(
        1, ge=1, description="...and at least this many optimizer steps apart; the last step is always sent."
    )
    max_attempts: int = Field(
        3,
        ge=1,
        description="Tries of a request whose failure is retryable (a crash, a Hub outage) before it ends in failed.",
    )
    retry_backoff_s: float = Field(30.0, ge=0, description="Wait before the second try; doubled for each later one.")
    max_message_bytes: int = Field(
        1_048_576,
        ge=65_536,
        description="The largest record the brokers take on the requests and DLQ topics "
        "(message.max.bytes, max.message.bytes); a request is accepted only when its retry and DLQ copies "
        "fit under it (daemon/kafka/copies.py).",
    )
    max_record_faults: int = Field(
        3,
        ge=1,
        description=(
            "A record whose handling fails unexpectedly (outside its job: an event the broker refuses, a "
            "bug) this many times in a row ends in failed (code internal) and goes to the DLQ, rather "
            "than being read again for ever."
        ),
    )
    retry_key_file: Path | None = Field(
        None,
        description=(
            "The key that signs a retry's attempt and due time (16 bytes or more; one for the whole fleet, systemd: "
            "%d/retry-key); unset: one made in work_dir/retry-key, which only this host knows."
        ),
    )
    stall_timeout_s: float | None = Field(
        1800.0,
        gt=0,
        description="A job silent this long while loading its model, training or "
        "evaluating is stopped (failed: stalled).",
    )
    drain_timeout_s: float = Field(
        60.0, gt=0, description="On stop, how long running jobs get to save a checkpoint before they are killed."
    )
    job_retention_days: float = Field(
        14.0,
        gt=0,
        description=(
            "A job's folder (work_dir/jobs/ID: log, checkpoints, artifact, journal) is removed once nothing in it "
            "changed for this long; a succeeded job's checkpoints go at once. Adapters published to the local "
            "sink (work_dir/outputs) are kept."
        ),
    )
    job_retention_count: int = Field(
        500, ge=1, description="The most job folders kept; beyond it the least recently changed go first."
    )
    checkpoint_store: str | None = Field(
        None,
        description=(
            "Where every checkpoint is also kept, for any host to resume from: s3://bucket/prefix, gs://..., "
            "az://container/prefix or a shared folder's absolute path; read and written with fsspec, "
            "dataset_storage_options and the host's own credentials; needs event_signing_key_file, whose key signs "
            "what the fleet writes there. Unset: checkpoints stay on this host's disk "
            "(daemon/store/checkpoints.py)."
        ),
    )
    checkpoint_store_keep: int = Field(
        2, ge=1, description="Complete checkpoints of one request kept in the store; older ones go after each upload."
    )
    checkpoint_store_max_bytes: int = Field(
        200 * 10**9,
        ge=1,
        description=(
            "The most bytes one checkpoint in the store may list (all its files): a larger one is not downloaded, nor "
            "one that would leave less than 1 GiB free on work_dir's disk. A checkpoint store needs "
            "event_signing_key_file (docs/guarantees.md)."
        ),
    )

    @field_validator("gpu_kinds")
    @classmethod
    def _kinds(cls, value: dict[str, float]) -> dict[str, float]:
        for name, gib in value.items():
            if not re.fullmatch(GPU_KIND_PATTERN, name):
                raise ValueError(f"{name[:40]!r} is not a GPU kind's name (lower-case letters, digits, '.', '_', '-')")
            if not 0 < gib <= 4096:
                raise ValueError(f"{name}: {gib} GiB; expected a GPU's memory, above 0 and at most 4096")
        return value

    @field_validator("checkpoint_store")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is None or value.startswith("/"):
            return value
        scheme, _, rest = value.partition("://")
        if scheme not in CHECKPOINT_STORE_SCHEMES or not rest.strip("/"):
            raise ValueError(
                f"expected {', '.join(s + '://bucket/prefix' for s in CHECKPOINT_STORE_SCHEMES)} or an "
                f"absolute folder, got {value!r}"
            )
        return value.rstrip("/")

    @field_validator("child_env")
    @classmethod
    def _variable_names(cls, value: list[str]) -> list[str]:
        for entry in value:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", entry):
                raise ValueError(f"expected a variable's name or a prefix ending in '*', got {entry!r}")
            if entry.upper().startswith("ADAPTERD_"):
                raise ValueError(
                    f"{entry!r}: the daemon's own settings (its tokens among them) never go to a job's child"
                )
        return value

    @property
    def outputs_dir(self) -> Path:
        return self.work_dir / "outputs"

    @property
    def jobs_dir(self) -> Path:
        return self.work_dir / "jobs"
