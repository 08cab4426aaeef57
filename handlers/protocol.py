"""What a child reads from its parent and writes back: the job spec the parent writes, the
messages the child sends back, the failure codes both use, and the one rule for which failures
are worth another try.

The child (`handlers.child.runner`) writes one message per line on its status pipe; the daemon decodes
each with `parse_child_message`, in one place (`daemon.job.supervisor`). Private to the daemon and
its child, so not in schemas/ (the wire contract). It imports pydantic, schemas and the standard
library only: the daemon imports this module and nothing else of handlers/, and the child never
imports the daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import ConfigDict, Field, JsonValue, TypeAdapter

from schemas.common import AdapterdError, Frozen, TrainingProgress
from schemas.evaluation import EvaluationResult
from schemas.images import ImageBounds
from schemas.provenance import ResolvedSource, TrackedRun


class FastSettings(Frozen):
    """The host's speed settings for a job (the daemon decides them). The child applies each only where
    the request leaves the same field unset: the request's own value always wins."""

    gradient_checkpointing: bool | None = Field(
        None,
        description="training.gradient_checkpointing (activation_checkpointing) where the request sets neither; None: "
        "TRL's own default, which turns it on.",
    )
    attn_implementation: (
        Literal[
            "eager",
            "sdpa",
            "flash_attention_2",
            "flash_attention_3",
            "kernels-community/flash-attn2",
            "kernels-community/vllm-flash-attn3",
        ]
        | None
    ) = Field(
        None,
        description=(
            "model.attn_implementation where the request leaves it unset; None: transformers' default (sdpa where the "
            "model has it). A flash attention the host cannot run (no CUDA, neither its package nor `kernels` "
            "installed) falls back to sdpa."
        ),
    )
    use_liger_kernel: bool | None = Field(
        None,
        description="training.use_liger_kernel where the request leaves it unset, and only where liger_kernel is "
        "installed; None: TRL's default (off).",
    )


class StartPoint(Frozen):
    """What a request starts from (its `start_from`, issue 63): the artifact its prerequisite published, as that
    request's `succeeded` event says: a Hub repo at its commit, or the local sink's folder."""

    request_id: str = Field(description="The prerequisite that published it.")
    repo_id: str
    commit_sha: str | None = Field(None, description="The Hub commit; None on the local sink.")
    folder: Path | None = Field(None, description="On the local sink: the folder holding the artifact.")


class JobSpec(Frozen):
    """What the parent hands a child: the validated request, where to put things, and how to report.
    Written as JSON into the job's folder; the child hands it to the method's handler as it is."""

    request: dict[str, JsonValue]
    checkpoints: Path = Field(
        description="Checkpoints of this request, kept across attempts: a redelivery resumes here."
    )
    artifact: Path = Field(description="What gets pushed: the adapter or model, the tokenizer and the model card.")
    progress_interval_s: float = Field(ge=0)
    progress_interval_steps: int = Field(1, ge=1)
    max_dataset_rows: int | None = Field(
        None, description="The operator's limit on training rows, for datasets whose size intake cannot see."
    )
    max_model_bytes: int | None = Field(
        None,
        description="The most bytes of a Hub model (base, reference, reward) the child "
        "downloads, by the Hub's listed sizes.",
    )
    max_template_bytes: int = Field(
        256 * 2**20, description="The memory a request's chat template may take to render once, in preflight."
    )
    max_template_s: float = Field(
        10.0, description="The time a request's chat template may take to render once, in preflight."
    )
    max_dataset_bytes: int | None = Field(
        None,
        description="The most bytes of a dataset source the child downloads (Hub, object storage, local "
        "files), by their listed sizes.",
    )
    report_to: list[str] = Field(default_factory=list, description="TRL `report_to` integrations; empty means none.")
    allowed_local_dataset_roots: list[Path] = Field(
        default_factory=list, description="The child checks every local file it expands to against these."
    )
    storage_options: dict[str, dict[str, JsonValue]] = Field(
        default_factory=dict, description="The operator's fsspec options per URL scheme."
    )
    vllm_server_base_url: str | None = Field(
        None, description="The operator's vLLM server, for GRPO and RLOO requests with vllm_mode 'server'."
    )
    allowed_dataset_urls: list[str] = Field(
        default_factory=list, description="Glob patterns of object-storage URLs a dataset's image paths may name."
    )
    images: ImageBounds = Field(
        default_factory=ImageBounds, description="The operator's bounds on a vision-language job's images."
    )
    tensorboard_dir: Path | None = Field(
        None, description="The operator's TensorBoard folder: the job's event files go to <it>/<request_id>."
    )
    traceparent: str | None = Field(
        None, description="The request's W3C traceparent: the child logs it and exports it as TRACEPARENT."
    )
    hub: bool = Field(
        True,
        description="Whether the host publishes to the Hub; without one the child asks the Hub "
        "nothing about the request's output.",
    )
    local_current_adapter: Path | None = Field(
        None,
        description="The local sink's adapter at the request's target, for the evaluation's 'current' "
        "baseline on a host without a Hub.",
    )
    memory_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="The share of its GPU the child may allocate "
        "(torch.cuda.set_per_process_memory_fraction); None: the whole GPU.",
    )
    fast: FastSettings = Field(
        default_factory=FastSettings,
        description="The host's speed settings, each applied where the request leaves the same field unset.",
    )
    start: StartPoint | None = Field(
        None, description="The artifact the request's `start_from` names (handlers/toolkit/start_from.py); None: none."
    )


# The stages a child goes through; `done` is the child's own (the daemon's `push` follows it).
ChildStage = Literal["preflight", "load_dataset", "load_model", "train", "evaluate", "save", "done"]

# Why a job failed: the `code` of a `failed` or `retrying` event. Consumers branch on these, so a
# code never changes meaning; a new cause gets a new code.
FailureCode = Literal[
    "model_unavailable",  # the base, reward or reference model cannot be downloaded or loaded
    "dataset_unavailable",  # the dataset cannot be loaded
    "dataset_invalid",  # the dataset loads, but its columns or rows do not fit the method
    "dataset_too_large",  # more rows than the operator's max_dataset_rows
    # a model or dataset whose files add up to more than max_model_bytes / max_dataset_bytes, found before downloading
    "download_too_large",
    "config_invalid",  # TRL refused the trainer arguments
    "cuda_required",  # QLoRA on a host without CUDA
    "vllm_unavailable",  # use_vllm on a host without vLLM installed or without CUDA
    "training_error",  # the trainer raised
    "child_crashed",  # the child died without saying why (a signal, out of memory)
    "timeout",  # the job ran past its timeout_s
    "stalled",  # no training step for stall_timeout_s
    "out_of_memory",  # CUDA ran out of memory (on a shared GPU: it runs again on a GPU of its own)
    "hub_unauthorized",  # the Hub refused the token (401/403)
    "hub_error",  # the Hub answered the push with another error
    "hub_unreachable",  # the Hub did not answer the push
    # handling the request failed unexpectedly max_record_faults times in a row (a bug of adapterd's); dead-lettered
    "internal",
    # a request's `after` names one that failed, was cancelled or rejected, or published nothing to start from
    "prerequisite_failed",
]

# HTTP answers that say "try again later": a timeout, rate limiting, and the server-side errors
# that pass (a 501 or 505 does not).
TRANSIENT_HTTP_STATUS = frozenset({408, 429, 500, 502, 503, 504})


def is_transient(http_status: int | None) -> bool:
    """The one rule, for the child's downloads and the daemon's push alike: a failed HTTP call is
    worth another try when no answer came (`None`: a network error or a timeout) or the answer says so."""
    return http_status is None or http_status in TRANSIENT_HTTP_STATUS


def is_transient_failure(exc: BaseException) -> bool:
    """`is_transient` for the exception of a failed Hub call (an HfHubHTTPError or an httpx2 TransportError: the
    caller, daemon/hub/push.py or handlers/toolkit/loading.py, has judged it one), read the same on both sides: the
    Hub's error carries its answer, a transport error none (no answer came)."""
    response = getattr(
        exc, "response", None
    )  # the HTTP client's answer; the protocol imports no HTTP client to name it
    return is_transient(response.status_code if response is not None else None)


class JobFailed(AdapterdError):
    """A valid request whose job could not finish; becomes a `failed` (or `retrying`) event.
    Raised by handlers in the child and by the daemon's own steps (the push, a timeout)."""

    def __init__(self, code: FailureCode, stage: str, message: str, *, retryable: bool = False) -> None:
        self.code = code
        self.stage = stage
        self.message = message
        self.retryable = retryable
        super().__init__(f"{stage}/{code}: {message}")


class ChildMessageBase(Frozen):
    # A loss can be NaN; it crosses the pipe as the NaN constant (Python's json reads and writes it)
    # and the daemon decides what to do with it, rather than the pipe turning it into null.
    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="constants")


class Ready(ChildMessageBase):
    """The child has imported the training stack and waits for its job (a warm child)."""

    kind: Literal["ready"] = "ready"


class Refused(ChildMessageBase):
    """The fork server found itself unfit to fork (CUDA touched, another thread running) and exits."""

    kind: Literal["refused"] = "refused"
    reason: str


class StageEntered(ChildMessageBase):
    kind: Literal["stage"] = "stage"
    stage: ChildStage


class FirstStep(ChildMessageBase):
    """The first optimizer step of this run: arrival → first step is the start latency."""

    kind: Literal["first_step"] = "first_step"
    time: float = Field(description="Wall-clock time (time.time()) of the step's end.")
    step: int


class Heartbeat(ChildMessageBase):
    """Sent every few seconds while training, for the daemon's stall watchdog."""

    kind: Literal["step"] = "step"
    step: int


class ProgressReport(TrainingProgress, ChildMessageBase):
    kind: Literal["progress"] = "progress"


class CheckpointSaved(ChildMessageBase):
    kind: Literal["checkpoint"] = "checkpoint"
    step: int
    path: str


class StoppedAtCheckpoint(ChildMessageBase):
    """The daemon asked the child to stop (SIGTERM); it saved this checkpoint and exits 75."""

    kind: Literal["stopped"] = "stopped"
    step: int
    path: str


class MemoryUse(Frozen):
    """The most memory a job took in its child, over load, train and evaluate (handlers/toolkit/memory.py)."""

    device: Literal["cuda", "cpu"] = Field(description="Where the job ran: its GPU, or the CPU.")
    peak_allocated_bytes: int | None = Field(
        description="torch's allocator peak (torch.cuda.max_memory_allocated): the tensors' bytes "
        "at their most; None on the CPU.",
    )
    peak_reserved_bytes: int | None = Field(
        description="torch's caching allocator peak (torch.cuda.max_memory_reserved): what it held from the "
        "device at its most; None on the CPU.",
    )
    device_peak_bytes: int = Field(
        description=(
            "On CUDA the device's own figure: the most memory the device reported used (every process on it) when the "
            "child sampled it, at its heartbeats and progress, so a peak between two samples may be missed. On the CPU "
            "the process's peak resident set (ru_maxrss)."
        )
    )


class TrainResult(ChildMessageBase):
    """A finished job: the artifact is complete on disk. Also kept in the job's journal."""

    kind: Literal["result"] = "result"
    trainer: str
    metrics: dict[str, float]
    base_model_revision: str | None
    ref_model_revision: str | None = Field(
        None, description="The resolved commit of DPO's or KTO's ref_model, when it came from the Hub."
    )
    teacher_model_revision: str | None = Field(
        None, description="The resolved commit of a distillation or gkd teacher_model, when it came from the Hub."
    )
    dataset_fingerprint: str | None
    dataset_sources: list[ResolvedSource] = Field(
        default_factory=list, description="What the rows were resolved to (provenance)."
    )
    durations_s: dict[str, float] = Field(
        description=(
            "Seconds per child stage (preflight, load_dataset, load_model, train, save), and the parts of load_model "
            "and train as '<stage>.<part>' (handlers/toolkit/reporting.py)."
        )
    )
    versions: dict[str, str]
    pipeline_tag: str | None = Field(
        None, description="The Hub task of a model that is not a plain text generator: 'image-text-to-text'."
    )
    tracking: list[TrackedRun] = Field(default_factory=list, description="The runs the job's metrics were reported to.")
    evaluation: EvaluationResult | None = Field(
        None, description="What the request's `evaluation` measured, after training."
    )
    memory: MemoryUse | None = Field(
        None, description="The most memory the job took in the child (load, train and evaluate)."
    )
    fast: dict[str, str | bool] = Field(
        default_factory=dict,
        description="The host's speed settings the job ran with, each where the request left the field unset.",
    )


class ChildError(ChildMessageBase):
    """The child's own account of why its job failed; it exits 1 after it."""

    kind: Literal["error"] = "error"
    code: FailureCode
    stage: ChildStage
    message: str
    retryable: bool

    @classmethod
    def of(cls, failure: JobFailed) -> ChildError:
        stage = failure.stage if failure.stage in ChildStage.__args__ else "train"  # type: ignore[attr-defined]
        return cls(code=failure.code, stage=stage, message=failure.message, retryable=failure.retryable)


ChildMessage = Annotated[
    Ready
    | Refused
    | StageEntered
    | FirstStep
    | Heartbeat
    | ProgressReport
    | CheckpointSaved
    | StoppedAtCheckpoint
    | TrainResult
    | ChildError,
    Field(discriminator="kind"),
]
CHILD_MESSAGE: TypeAdapter[ChildMessage] = TypeAdapter(ChildMessage)


def parse_child_message(line: bytes | str) -> ChildMessage:
    """One line of the status pipe; a pydantic ValidationError for anything else."""
    return CHILD_MESSAGE.validate_json(line)
