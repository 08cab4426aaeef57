"""Version 1 of the lifecycle events published to `adapterd.events`, keyed by request id.

Every request ends in exactly one terminal event: `succeeded`, `failed`, `cancelled` or `rejected`.
How they are read back (strictly by adapterd, leniently by a consumer) is schemas/event_reading.py's.
"""

from __future__ import annotations

import secrets
import socket
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, TypeAdapter

from .addresses import HostPort
from .common import (
    GPU_KIND_PATTERN,
    SCHEMA_VERSION,
    FieldError,
    Frozen,
    RejectReason,
    TrainingProgress,
)
from .evaluation import EvaluationReport, Published
from .provenance import ResolvedSource, TrackedRun

FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]

TERMINAL_TYPES = frozenset({"succeeded", "failed", "cancelled", "rejected"})

Stage = Literal["intake", "preflight", "load_model", "load_dataset", "train", "evaluate", "save", "push"]
STAGES: frozenset[str] = frozenset(Stage.__args__)  # type: ignore[attr-defined]


def _now() -> datetime:
    return datetime.now(UTC)


def _event_id() -> str:
    return secrets.token_hex(16)  # 128 random bits, as a uuid4 has; cheaper on the intake path


class EventBase(Frozen):
    if TYPE_CHECKING:  # each event's model declares it as its Literal name
        type: str
    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: str = Field(default_factory=_event_id, description="Unique per event; consumers de-duplicate on it.")
    request_id: str | None = Field(
        description="The request's id; null only for a rejected message whose id could not be read."
    )
    time: datetime = Field(default_factory=_now)
    host: str = Field(default_factory=socket.gethostname)
    attempt: int = Field(1, ge=1)
    metadata: dict[str, str] = Field(default_factory=dict, description="The request's metadata, echoed.")


class Accepted(EventBase):
    type: Literal["accepted"] = "accepted"
    method: str
    priority_class: str | None = Field(
        None, description="The request's priority class as the fleet resolved it; null on a host with no classes."
    )
    team: str | None = Field(
        None,
        description="The request's team as the fleet resolved it ('default' when it named none); "
        "null on a host with no classes.",
    )
    host_slots: int | None = Field(
        None,
        ge=1,
        description=(
            "How many jobs the accepting host runs at once: the fleet's slots, summed over its hosts, for the waiting "
            "requests' ETAs; null on a host with no classes."
        ),
    )
    gpu_kind: str | None = Field(
        None,
        pattern=GPU_KIND_PATTERN,
        description=(
            "The kind of the accepting host's GPUs ('h100-80gb'), so the waiting requests' ETAs place a request that "
            "asks for a kind or a GPU's memory only on slots that serve it; null on a host with no classes, without "
            "GPUs, or whose kind is unknown."
        ),
    )
    model: str | None = Field(
        None,
        max_length=1024,
        description=(
            "The base model the request names (model.id), so every host expects the job's length from jobs of the same "
            "model; null on a host with no classes."
        ),
    )
    max_steps: int | None = Field(
        None,
        ge=1,
        description=(
            "The request's training.max_steps, so every host paces the job's length before its first progress; null "
            "when it names none, and on a host with no classes."
        ),
    )
    plan: Literal["data-parallel", "sharded"] | None = Field(
        None,
        description=(
            "How the job's GPUs hold its model: 'data-parallel', a whole copy on each (one GPU: one copy), "
            "or 'sharded' across them (resources.shard 'fsdp', asked, or chosen for 'auto' because a whole "
            "copy does not fit one of the host's GPUs and a shard does: docs/methods.md); null from a "
            "daemon before the plan was said."
        ),
    )
    estimate_bytes_per_gpu: int | None = Field(
        None,
        ge=0,
        description=(
            "The job's memory estimate on each of its GPUs under that plan (as succeeded.memory.estimate_bytes); "
            "null when its models' weight headers could not be read, and for a job on a host that does not "
            "estimate it (a CPU host's Hub model)."
        ),
    )


class Rejected(EventBase):
    type: Literal["rejected"] = "rejected"
    reason: RejectReason
    errors: list[FieldError] = Field(min_length=1)


class JobMemory(Frozen):
    """A job's memory on its device: estimated before it started, measured while it ran."""

    estimate_bytes: int | None = Field(
        description=(
            "The estimated allocator peak (weights, trainable state, activations, logits, generation: docs/events.md) "
            "on each of its GPUs under its plan (sharded: its shard, plus the layers gathered to compute), scaled by "
            "what earlier one-GPU jobs of the same model and method measured on this host; null when its models' "
            "weight headers could not be read."
        )
    )
    share_bytes: int | None = Field(
        None, description="On a GPU shared with other jobs: the memory its process was held to; null on a whole GPU."
    )
    device: Literal["cuda", "cpu"] | None = Field(
        None, description="Where it trained; null when the child measured nothing."
    )
    peak_allocated_bytes: int | None = Field(
        None, description="torch's allocator peak on the GPU (torch.cuda.max_memory_allocated); null on the CPU."
    )
    device_peak_bytes: int | None = Field(
        None,
        description=(
            "The device's own figure: the most memory the GPU reported in use while the job ran (sampled, so a peak "
            "between two samples can be missed), or on the CPU the child's peak resident set."
        ),
    )


class Started(EventBase):
    type: Literal["started"] = "started"
    method: str
    slot: str = Field(description="The GPU ids given to the job ('cpu' on a host without GPUs).")
    memory_share_bytes: int | None = Field(
        None,
        description=(
            "On a GPU shared with other jobs (the host's max_jobs_per_gpu): the memory the job may "
            "allocate there; null on whole GPUs."
        ),
    )
    pid: int | None = Field(
        description=(
            "The child's process id on the daemon's host (a job of several GPUs: torchrun's agent); null for a child "
            "that runs elsewhere (a remote engine), whose `child` says where."
        )
    )
    child: str | None = Field(
        None,
        description=(
            "Where the job's child runs, as the daemon names it in its logs: 'pid 4242' for a process on its host. "
            "Null from daemons older than this field."
        ),
    )
    endpoint: HostPort | None = Field(
        None,
        description=(
            "host:port of the endpoint of the daemon that runs the job, where `adapterd logs` reads its log "
            "(/jobs/ID/log, with the fleet's logs_token); null when that daemon serves no logs. A host and a port "
            "only: no scheme, user, path or query."
        ),
    )
    endpoint_scheme: Literal["http", "https"] | None = Field(
        None,
        description=(
            "How the endpoint is reached: 'https' when its daemon serves it over TLS (http_tls_certfile), 'http' "
            "without; null with no endpoint (an endpoint of an event without it is http)."
        ),
    )
    resumed_step: int | None = Field(
        None,
        description=(
            "The step of the checkpoint the job resumes from (its first trained step is the one after); "
            "null when it starts at step 0."
        ),
    )
    resumed_from: Literal["local", "store"] | None = Field(
        None,
        description=(
            "Where that checkpoint came from: 'local', this host's disk (an earlier attempt here); 'store', the "
            "operator's checkpoint_store, downloaded because it was newer than anything on this host (an attempt on "
            "another host); null with no resume."
        ),
    )
    gpus: int | None = Field(
        None,
        ge=1,
        description=(
            "The GPUs of a job run on the operator's Ray cluster (its ranks), which `slot` ('ray') does not name; "
            "null for a job on its host's own slots."
        ),
    )


class Progress(TrainingProgress, EventBase):
    type: Literal["progress"] = "progress"


class Checkpoint(EventBase):
    type: Literal["checkpoint"] = "checkpoint"
    step: int
    path: str = Field(description="The checkpoint's folder on the host that saved it.")
    location: Literal["local", "store"] = Field(
        "local",
        description=(
            "'store': the checkpoint is whole in the host's checkpoint_store (at store_url), where any host "
            "resumes from it; 'local': it is on this host's disk only (no store is set, or the upload "
            "failed: store_error says why)."
        ),
    )
    store_url: str | None = Field(None, description="The checkpoint's folder in the store, with location 'store'.")
    store_error: str | None = Field(
        None, description="Why the upload to the store failed, when it did (the job goes on)."
    )


class Succeeded(EventBase):
    type: Literal["succeeded"] = "succeeded"
    sink: Literal["hub", "local"]
    repo_id: str
    revision: str = Field(
        description=(
            "Where the artifact was committed: output.revision; for an adapter that failed its gate, the pull "
            "request's ref (refs/pr/N; on the local sink pr/<request_id>) or evaluation.fail_branch; for published "
            "'none', output.revision, where nothing was committed."
        )
    )
    commit_sha: str | None = Field(
        description="The Hub commit holding the adapter; null for the local sink and for published 'none'."
    )
    commit_url: str | None
    location: str = Field(
        description=(
            "Where the artifact is: the Hub repo URL; on the local sink (sink 'local', commit_sha null) the folder "
            "holding the adapter, the pointer to deploy from; or (published 'none') the folder on the host."
        )
    )
    published: Published = Field(
        "main",
        description=(
            "Where the artifact went: 'main' is the requested output.revision (the gate passed, or the request had no "
            "evaluation); an adapter that failed its gate went to a Hub pull request ('pr', see pr_url), to "
            "evaluation.fail_branch ('branch'), or nowhere ('none'). Deploy only what says 'main'."
        ),
    )
    pr_url: str | None = Field(
        None,
        description="The pull request that holds the adapter, for published 'pr': the Hub's URL, or the local "
        "sink's folder as a file:// URL.",
    )
    evaluation: EvaluationReport | None = Field(
        None,
        description=(
            "What the request's evaluation measured (the adapter's numbers, each baseline's beside them), each gate "
            "rule's outcome and the verdict; null without an evaluation block."
        ),
    )
    files: list[str]
    metrics: dict[str, FiniteFloat] = Field(
        description=(
            "The trainer's summary (train_runtime, train_samples_per_second, train_loss, ...), first_loss and "
            "final_loss, eval_loss when it evaluated, world_size, median_step_s: the median seconds between optimizer "
            "steps, the first step's set-up left out (when this attempt ran two steps or more), and what each of the "
            "job's processes held of the model's parameters, rank<r>_param_count, rank<r>_param_bytes and "
            "rank<r>_trainable_param_count (a whole copy each, or its shard under resources.shard 'fsdp'); in a job of "
            "several processes each one's peak memory, rank<r>_peak_bytes, and tokens/s, rank<r>_tokens_per_s."
        )
    )
    durations_s: dict[str, float] = Field(
        description=(
            "Seconds per stage: queue (arrival to start), the child's preflight, load_dataset, load_model, train and "
            "save, then push and total; until_first_step (arrival to the first optimizer step) when this attempt "
            "trained. Two stages are split into parts that add up to them, keyed '<stage>.<part>': load_model.files "
            "(finding or downloading the model, its tokenizer), load_model.cuda_init (CUDA's own start; absent without "
            "CUDA), load_model.weights (from_pretrained), load_model.trainer (the trainer's construction: "
            "tokenization, PEFT, moving to the device); train.first_step (set-up to the end of the first optimizer "
            "step) and train.steps. Empty for a duplicate found by its Hub commit."
        )
    )
    versions: dict[str, str] = Field(description="adapterd, trl, transformers, peft, torch, datasets.")
    method: str
    trainer: str = Field(description="The TRL trainer and config classes that ran.")
    base_model: str
    base_model_revision: str | None = Field(
        description="The resolved commit of the base model, when it came from the Hub."
    )
    ref_model: str | None = Field(
        None,
        description="The reference model a dpo or kto request named (ref_model.id); null "
        "when the base was the reference.",
    )
    ref_model_revision: str | None = Field(
        None, description="The resolved commit of ref_model, when it came from the Hub."
    )
    teacher_model: str | None = Field(
        None, description="The teacher a distillation or gkd request named (teacher_model.id); null for other methods."
    )
    teacher_model_revision: str | None = Field(
        None, description="The resolved commit of teacher_model, when it came from the Hub."
    )
    dataset_fingerprint: str | None
    dataset_sources: list[ResolvedSource] = Field(
        default_factory=list,
        description=(
            "The resolved dataset sources: Hub commit, object ETags or version ids, files and sizes; empty for a "
            "duplicate found by its Hub commit."
        ),
    )
    tracking: list[TrackedRun] = Field(
        default_factory=list,
        description=(
            "The experiment-tracker runs the job reported its metrics to (report_to), each with "
            "its id and, for MLflow, its URL."
        ),
    )
    duplicate: bool = Field(False, description="True when a redelivered request had already succeeded.")
    memory: JobMemory | None = Field(None, description="Its memory, estimated and measured; null for a duplicate.")


class Failed(EventBase):
    type: Literal["failed"] = "failed"
    code: str = Field(description="Stable machine-readable cause, e.g. 'model_unavailable'.")
    message: str
    stage: Stage
    retryable: bool


class Retrying(EventBase):
    """Not terminal: the attempt failed in a way that may pass, and the request goes back to the end
    of its partition for attempt `attempt + 1`."""

    type: Literal["retrying"] = "retrying"
    code: str
    message: str
    stage: Stage
    max_attempts: int


class Cancelled(EventBase):
    type: Literal["cancelled"] = "cancelled"
    reason: str


class Queued(EventBase):
    """Not terminal, on a fleet with priority classes: the request waits for a slot. Published soon after it arrives
    (or is read and has to wait), and again while it waits whenever its place or ETA moves materially: an ETA can be
    said where none could, its expected start moved by more than 5 s and a fifth of its wait, or its place moved back
    by more than a fifth. The latest one is current."""

    type: Literal["queued"] = "queued"
    priority_class: str
    team: str
    place: int = Field(
        ge=1,
        description="1 for the next to start: its place in the fleet's order (class, then fair share, then arrival).",
    )
    eta_s: float | None = Field(
        None,
        ge=0,
        description=(
            "Seconds until it is expected to start, from the running jobs' own ETAs and recent durations of the same "
            "method and model; null when nothing is known to estimate from."
        ),
    )


class Preempted(EventBase):
    """Not terminal: a request of a higher class took its slot. The job saved a checkpoint on the stop, and the request
    waits again without spending an attempt; it resumes from that checkpoint when it runs again."""

    type: Literal["preempted"] = "preempted"
    by: str = Field(description="The request id of the higher-class request that took its slot.")
    priority_class: str
    preemptions: int = Field(ge=1, description="How many times this request has been preempted, this time included.")
    stopped_at_step: int | None = Field(
        None,
        description=(
            "The optimizer step the job stopped at: the step of the checkpoint it saved on the stop, else (it ended "
            "before saving one) the last step it reported; null when it reported none."
        ),
    )
    resume_from_step: int | None = Field(
        None,
        description=(
            "The step of the last checkpoint the job saved, which it resumes from when it runs again: the work kept. "
            "Null: it saved none and starts over."
        ),
    )
    step: int | None = Field(
        None, description="The same as stopped_at_step; kept for the readers of earlier events, which it had."
    )


class Waiting(EventBase):
    """Not terminal: the request was reached and waits, for requests its `after` names to succeed (docs/requests.md,
    Pipelines), or for the Ray cluster it runs on to answer (`engine`). Published when it starts waiting and, for
    `after`, again whenever the set it waits for changes; it then starts, or ends `failed` (`prerequisite_failed`)
    when one of them fails, is cancelled or is rejected. A cluster's outage fails no request: it starts once the
    cluster answers."""

    type: Literal["waiting"] = "waiting"
    after: list[str] = Field(default_factory=list, description="The ids of its `after` that have not succeeded yet.")
    engine: str | None = Field(
        None, description="Why the engine it runs on cannot take it now (its Ray cluster does not answer); else null."
    )


class Held(EventBase):
    """Not terminal: a request reached while it is held (`adapterd hold` or `pause`) is not started; it waits, the
    requests behind it going first, until a release. Published by the host that reached it, once per hold."""

    type: Literal["held"] = "held"
    reason: str = Field(description="The hold's (or pause's) reason.")


class Paused(EventBase):
    """Not terminal: a running job was paused (`adapterd pause`). It saved a checkpoint on the stop, as on a daemon
    stop, and its request waits held without spending an attempt; released, it resumes from that checkpoint."""

    type: Literal["paused"] = "paused"
    reason: str = Field(description="The pause's reason.")
    stopped_at_step: int | None = Field(
        None, description="The optimizer step the job stopped at, as in `preempted`; null when it reported none."
    )
    resume_from_step: int | None = Field(
        None, description="The step of the last checkpoint it saved, which it resumes from; null: it starts over."
    )


class Released(EventBase):
    """Not terminal: a held or paused request was released (`adapterd release` or `resume`) and waits as any other.
    Published by each host that told it `held` or `paused`."""

    type: Literal["released"] = "released"
    reason: str = Field(description="The release's (or resume's) reason.")


Event = Annotated[
    Accepted
    | Rejected
    | Started
    | Progress
    | Checkpoint
    | Retrying
    | Succeeded
    | Failed
    | Cancelled
    | Queued
    | Preempted
    | Waiting
    | Held
    | Paused
    | Released,
    Field(discriminator="type"),
]
EVENT_ADAPTER: TypeAdapter[Event] = TypeAdapter(Event)
