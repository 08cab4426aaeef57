"""What every handler does the same way, in the child process: talk to the parent, load the base
model and the dataset, build LoRA and trainer arguments, report progress, save the artifact.

Handlers call these helpers explicitly; nothing here decides how a method trains.
"""

from __future__ import annotations

import os
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import torch
from datasets import Dataset, load_dataset
from httpx2 import TransportError
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from peft import LoraConfig, PeftModel
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Trainer,
    TrainerCallback,
)
from transformers.trainer_utils import get_last_checkpoint

from schemas.job import (
    CheckpointSaved,
    ChildError,
    ChildMessage,
    FirstStep,
    Heartbeat,
    JobFailed,
    JobSpec,
    ProgressReport,
    Ready,
    StageEntered,
    StoppedAtCheckpoint,
    is_transient,
)
from schemas.request import (
    DatasetSpec,
    LoraSpec,
    ModelSpec,
    RequestBase,
    RewardModelSpec,
)

# While training, the child tells the daemon it is alive at least this often (at step ends).
HEARTBEAT_S = 5.0
# The child's exit status after stopping at a checkpoint because the daemon asked it to.
EXIT_STOPPED = 75
VERSIONED_PACKAGES = ("adapterd", "trl", "transformers", "peft", "torch", "datasets", "accelerate")
ConfigT = TypeVar("ConfigT")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def package_versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "unknown"
    return found


class StatusReporter:
    """Writes one JSON object per line to the pipe the parent reads (fd in ADAPTERD_STATUS_FD)."""

    def __init__(self, fd: int) -> None:
        self._stream = os.fdopen(fd, "w", buffering=1)
        self.stage = "preflight"
        self._stage_started = time.monotonic()
        self.durations_s: dict[str, float] = {}
        # Set on SIGTERM while training: the trainer saves a checkpoint at its next step and stops.
        self.stop_requested = False

    def restart_clock(self) -> None:
        """Stage durations count from the job's arrival, not from the child's start."""
        self._stage_started = time.monotonic()

    def send(self, message: ChildMessage) -> None:
        self._stream.write(message.model_dump_json() + "\n")

    def ready(self) -> None:
        self.send(Ready())

    def enter(self, stage: str) -> None:
        now = time.monotonic()
        self.durations_s[self.stage] = round(self.durations_s.get(self.stage, 0.0) + now - self._stage_started, 3)
        self.stage, self._stage_started = stage, now
        self.send(StageEntered(stage=stage))  # type: ignore[arg-type]

    def error(self, failure: JobFailed) -> None:
        self.send(ChildError.of(failure))


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed Hub call; None when no answer came (a network error, a timeout)."""
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def resolve_model(spec: ModelSpec | RewardModelSpec) -> tuple[str, str | None]:
    """The local folder of the base model and, for a Hub model, the commit it resolved to."""
    if spec.id.startswith("/"):
        if not Path(spec.id).is_dir():
            raise JobFailed("model_unavailable", "load_model", f"model.id: local path {spec.id} is not a directory")
        return spec.id, None
    try:
        sha = HfApi().model_info(spec.id, revision=spec.revision).sha
        return snapshot_download(spec.id, revision=sha), sha
    except (HfHubHTTPError, TransportError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model",
            f"model.id: cannot download {spec.id}@{spec.revision or 'main'} from the Hub: {exc!r}",
            retryable=is_transient(_http_status(exc)),
        ) from exc


def load_tokenizer(path: str, spec: ModelSpec) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise JobFailed("model_unavailable", "load_model", f"model.id: {spec.id} has no loadable tokenizer: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_hardware(spec: ModelSpec) -> None:
    """QLoRA loads the base through bitsandbytes, which needs CUDA: fail before anything is loaded."""
    if spec.quantization != "none" and not torch.cuda.is_available():
        raise JobFailed(
            "cuda_required", "preflight",
            f"model.quantization: {spec.quantization} (QLoRA) needs a CUDA GPU and this host has none; use quantization 'none'",
        )


def model_kwargs(spec: ModelSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dtype": DTYPES.get(spec.dtype, "auto"), "trust_remote_code": spec.trust_remote_code}
    if spec.quantization == "4bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16
        )
    elif spec.quantization == "8bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    return kwargs


def load_causal_lm(path: str, spec: ModelSpec) -> PreTrainedModel:
    try:
        return AutoModelForCausalLM.from_pretrained(path, **model_kwargs(spec))
    except (OSError, ValueError) as exc:
        raise JobFailed("model_unavailable", "load_model", f"model.id: {spec.id} is not a loadable causal LM: {exc}") from exc


def load_sequence_classifier(path: str, spec: ModelSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A one-label sequence classifier (a reward model) on the base's weights, with a new score head."""
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **model_kwargs(spec))
    except (OSError, ValueError) as exc:
        raise JobFailed("model_unavailable", "load_model", f"model.id: {spec.id} is not loadable as a sequence classifier: {exc}") from exc
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def is_conversational(dataset: Dataset) -> bool:
    """TRL's own test: rows of role/content messages rather than plain text."""
    from trl.data_utils import is_conversational as trl_is_conversational

    return len(dataset) > 0 and trl_is_conversational(dataset[0])


def check_chat_template(tokenizer: PreTrainedTokenizerBase, dataset: Dataset, spec: ModelSpec) -> None:
    if is_conversational(dataset) and tokenizer.chat_template is None:
        raise JobFailed("dataset_invalid", "preflight", f"model.id: {spec.id} has no chat template, and the dataset's rows are conversational")


def check_columns(request: RequestBase, dataset: Dataset) -> None:
    problem = request.dataset_problem(dataset.column_names)
    if problem:
        raise JobFailed("dataset_invalid", "preflight", problem)


def load_datasets(spec: DatasetSpec, job: JobSpec) -> tuple[Dataset, Dataset | None]:
    """The training split (and the eval split, if asked), columns renamed, at most `max_samples` rows,
    within the operator's `max_dataset_rows`."""
    try:
        if spec.rows is not None:
            train, evaluation = Dataset.from_list(list(spec.rows)), None
        else:
            def split(name: str) -> Dataset:
                return load_dataset(spec.id, spec.config, split=name, revision=spec.revision, data_files=spec.data_files)

            train = split(spec.split)
            evaluation = split(spec.eval_split) if spec.eval_split else None
    except Exception as exc:  # datasets raises many unrelated types for "cannot load"
        source = "inline rows" if spec.rows is not None else f"{spec.id} (split {spec.split})"
        raise JobFailed(
            "dataset_unavailable", "load_dataset", f"dataset: cannot load {source}: {type(exc).__name__}: {exc}",
            retryable=isinstance(exc, HfHubHTTPError | TransportError) and is_transient(_http_status(exc)),
        ) from exc
    if spec.columns:
        missing = sorted(set(spec.columns) - set(train.column_names))
        if missing:
            raise JobFailed("dataset_invalid", "preflight", f"dataset.columns: {missing} not in the dataset's columns {train.column_names}")
        train = train.rename_columns(spec.columns)
        evaluation = evaluation.rename_columns(spec.columns) if evaluation is not None else None
    if spec.max_samples is not None and len(train) > spec.max_samples:
        train = train.select(range(spec.max_samples))
    if job.max_dataset_rows is not None and len(train) > job.max_dataset_rows:
        raise JobFailed(
            "dataset_too_large", "load_dataset",
            f"dataset: {len(train)} training rows; this host allows at most {job.max_dataset_rows} (max_dataset_rows); set dataset.max_samples",
        )
    return train, evaluation


def lora_config(spec: LoraSpec | None, task_type: str) -> LoraConfig | None:
    if spec is None:
        return None
    return LoraConfig(task_type=task_type, **spec.model_dump())


def trl_config(config_class: type[ConfigT], request: RequestBase, job: JobSpec, method_block: str, **derived: Any) -> ConfigT:
    """The method's TRL config: the request's `training` block and method block, plus the daemon's
    own choices (where checkpoints go, the reporting integrations policy allows, CPU when there is no GPU)."""
    arguments: dict[str, Any] = {"logging_steps": 1, "save_strategy": "steps", "save_total_limit": 2}
    arguments.update(request.set_fields("training"))
    arguments.update(request.set_fields(method_block))
    arguments.update(derived)
    arguments.update(
        output_dir=str(job.checkpoints),
        report_to=list(job.report_to) or "none",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    try:
        return config_class(**arguments)
    except (TypeError, ValueError) as exc:
        raise JobFailed("config_invalid", "preflight", f"training: {config_class.__name__} refused the arguments: {exc}") from exc


def last_checkpoint(job: JobSpec) -> str | None:
    """The newest checkpoint of an earlier attempt at this request: training resumes there, not at step 0."""
    return get_last_checkpoint(str(job.checkpoints)) if job.checkpoints.is_dir() else None


class JobCallback(TrainerCallback):
    """What the daemon sees of a trainer: the first optimizer step; progress at the job's interval
    (at least `progress_interval_steps` steps and `progress_interval_s` seconds apart, and always the
    last step); each checkpoint saved; and, once a stop is requested, a checkpoint and a clean exit."""

    def __init__(self, reporter: StatusReporter, job: JobSpec) -> None:
        self.reporter = reporter
        self.job = job
        self.started = time.monotonic()
        self.first_step: int | None = None  # global step this run started from (non-zero after a resume)
        self.last_sent_at = float("-inf")
        self.last_sent_step = 0
        self.last_tokens: tuple[float, float] | None = None  # (time, tokens seen) at the previous log
        self.last_beat = float("-inf")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.started = time.monotonic()
        self.first_step = state.global_step
        self.last_sent_step = state.global_step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == (self.first_step or 0) + 1:
            self.reporter.send(FirstStep(time=time.time(), step=state.global_step))
        if time.monotonic() - self.last_beat >= HEARTBEAT_S:
            self.last_beat = time.monotonic()
            self.reporter.send(Heartbeat(step=state.global_step))  # alive: the daemon's stall watchdog listens
        if self._stop_everywhere(args):
            control.should_save = True
            control.should_training_stop = True

    def _stop_everywhere(self, args: Any) -> bool:
        """Whether any rank was asked to stop. Data-parallel ranks must stop at the same step, or
        the ones still training wait forever on the others' gradients: so they agree at each step."""
        if args.world_size <= 1:
            return self.reporter.stop_requested
        flag = torch.tensor([1.0 if self.reporter.stop_requested else 0.0], device=args.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        stop = bool(flag.item())
        self.reporter.stop_requested = stop
        return stop

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.reporter.send(CheckpointSaved(step=state.global_step, path=str(path)))
        if self.reporter.stop_requested:
            self.reporter.send(StoppedAtCheckpoint(step=state.global_step, path=str(path)))
            raise SystemExit(EXIT_STOPPED)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs or any(key.startswith("eval_") for key in logs):
            return  # the end-of-training summary or an evaluation, not a training step
        now = time.monotonic()
        tokens_per_s = None
        if "num_tokens" in logs:  # TRL's trainers log the tokens seen so far
            if self.last_tokens is not None and now > self.last_tokens[0]:
                tokens_per_s = (logs["num_tokens"] - self.last_tokens[1]) / (now - self.last_tokens[0])
            self.last_tokens = (now, float(logs["num_tokens"]))
        last = state.global_step >= state.max_steps
        due = (
            state.global_step - self.last_sent_step >= self.job.progress_interval_steps
            and now - self.last_sent_at >= self.job.progress_interval_s
        )
        if not (due or last):
            return
        self.last_sent_at, self.last_sent_step = now, state.global_step
        total = max(state.max_steps, 1)
        done_this_run = state.global_step - (self.first_step or 0)
        eta = (now - self.started) / done_this_run * (total - state.global_step) if done_this_run > 0 else None
        self.reporter.send(ProgressReport(
            step=state.global_step, total_steps=total, epoch=state.epoch,
            loss=logs.get("loss"), learning_rate=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"),
            tokens_per_s=tokens_per_s, eta_s=eta,
        ))


def save_artifact(trainer: Trainer, request: RequestBase, artifact: Path, model: PreTrainedModel | None = None) -> None:
    """Write what gets pushed: the adapter (or merged / full weights) and the tokenizer files.
    `model` is the trained model when it is not `trainer.model` (PPO trains a policy+value wrapper)."""
    if not trainer.accelerator.is_main_process:
        return  # in a multi-GPU job, rank 0 writes the artifact
    artifact.mkdir(parents=True, exist_ok=True)
    model = model if model is not None else trainer.model
    if request.output.push == "merged" and isinstance(model, PeftModel):
        model = model.merge_and_unload()
    model.save_pretrained(artifact)
    trainer.processing_class.save_pretrained(artifact)


def final_metrics(train_output: Any, trainer: Trainer) -> dict[str, float]:
    metrics = {k: float(v) for k, v in train_output.metrics.items() if isinstance(v, int | float)}
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    if losses:
        metrics["first_loss"], metrics["final_loss"] = float(losses[0]), float(losses[-1])
    metrics["world_size"] = float(trainer.args.world_size)
    return metrics
