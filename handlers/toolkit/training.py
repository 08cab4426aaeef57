"""The trainer's side of a job, in the child: the TRL config (the request's fields plus the daemon's
own choices), LoRA, where an earlier attempt's checkpoint is, the artifact that gets pushed, and
the final metrics and package versions a `succeeded` event carries.
"""

from __future__ import annotations

import dataclasses
import typing
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import torch
from peft import LoraConfig, PeftModel
from transformers import PreTrainedModel, Trainer
from transformers.trainer_utils import get_last_checkpoint

from handlers.protocol import JobFailed, JobSpec
from handlers.toolkit import fast
from handlers.toolkit.callbacks import JobCallback, StepClock
from handlers.toolkit.distributed.fsdp import is_sharded, rank_holdings, save_merged
from handlers.toolkit.lora_patterns import resolved
from handlers.toolkit.start_from import saved_adapters
from schemas.provenance import TrackedRun
from schemas.request import LoraSpec, RequestBase

VERSIONED_PACKAGES = ("adapterd", "trl", "transformers", "peft", "torch", "datasets", "accelerate")
ConfigT = TypeVar("ConfigT")


def package_versions() -> dict[str, str]:
    found = {}
    for name in VERSIONED_PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = "unknown"
    return found


def with_objects(config_class: type, arguments: dict[str, Any]) -> dict[str, Any]:
    """The arguments, with each JSON object given for a field typed as a config class (PEFT's
    `eva_config: EvaConfig`, ...) built into that class, as the dataclass expects."""
    hints = typing.get_type_hints(config_class)
    built = dict(arguments)
    for name, value in arguments.items():
        if not isinstance(value, dict) or name not in hints:
            continue
        classes = [
            c
            for c in (typing.get_args(hints[name]) or (hints[name],))
            if isinstance(c, type) and dataclasses.is_dataclass(c)
        ]
        if classes:
            built[name] = classes[0](**value)
    return built


def lora_config(spec: LoraSpec | None, task_type: str, model: PreTrainedModel, **derived: Any) -> LoraConfig | None:
    """PEFT's LoraConfig from the request's `peft` block, for `model` (its patterns matched on the
    model's modules by adapterd, handlers/toolkit/lora_patterns.py); `derived`: what the handler decides in
    place of a default (a vision-language model's `target_modules`)."""
    if spec is None:
        return None
    fields = resolved({**spec.set_fields(), **derived}, [name for name, _ in model.named_modules()])
    try:
        return LoraConfig(task_type=task_type, **with_objects(LoraConfig, fields))
    except (TypeError, ValueError) as exc:
        raise JobFailed("config_invalid", "preflight", f"peft: LoraConfig refused the arguments: {exc}") from exc


def trl_config(
    config_class: type[ConfigT], request: RequestBase, job: JobSpec, method_block: str, **derived: Any
) -> ConfigT:
    """The method's TRL config: the request's `training` block and method block, plus the daemon's
    own choices (where checkpoints go, the reporting integrations policy allows, CPU when there is no GPU)
    and the host's speed settings where the request leaves them unset (handlers/toolkit/fast.py)."""
    # A tracker's run is named after the request (TrainingArguments.run_name), unless it names one.
    arguments: dict[str, Any] = {
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_total_limit": 2,
        "run_name": request.request_id,
    }
    if request.evaluation is not None and request.evaluation.require_finite_losses:
        # transformers logs the mean of earlier losses in place of a NaN one by default: the gate
        # must see the NaN to fail on it. Logging only; the gradients are the same.
        arguments["logging_nan_inf_filter"] = False
    arguments.update(request.set_fields("training"))
    arguments.update(request.set_fields(method_block))
    arguments.update(derived)
    config_fields = {field.name for field in dataclasses.fields(config_class)}  # type: ignore[arg-type]
    arguments.update(fast.training_arguments(job, arguments, config_fields))
    arguments.update(
        output_dir=str(job.checkpoints),
        report_to=list(job.report_to) or "none",
        use_cpu=not torch.cuda.is_available(),
        disable_tqdm=True,
    )
    if request.resources.shard == "fsdp":
        # The Trainer checkpoints no optimizer state for a model sharded as it loads, and refuses to start unless
        # told to save the model alone: handlers/toolkit/distributed/checkpoints.py saves the rest of the state.
        arguments["save_only_model"] = True
    try:
        return config_class(**with_objects(config_class, arguments))
    except (TypeError, ValueError) as exc:
        raise JobFailed(
            "config_invalid", "preflight", f"training: {config_class.__name__} refused the arguments: {exc}"
        ) from exc


def last_checkpoint(job: JobSpec) -> str | None:
    """The newest checkpoint of an earlier attempt at this request: training resumes there, not at step 0."""
    return get_last_checkpoint(str(job.checkpoints)) if job.checkpoints.is_dir() else None


def save_artifact(trainer: Trainer, request: RequestBase, artifact: Path, model: PreTrainedModel | None = None) -> None:
    """Write what gets pushed: the adapter (or merged / full weights) and the tokenizer files.
    `model` is the trained model when it is not `trainer.model` (PPO trains a policy+value wrapper)."""
    # A PreTrainedModel or a PeftModel around one: each saves itself (the Trainer types it as a Module).
    trained: Any = model if model is not None else trainer.model
    main = trainer.accelerator.is_main_process
    if not main and not is_sharded(trained):
        return  # in a data-parallel job, rank 0 writes the artifact
    if main:
        artifact.mkdir(parents=True, exist_ok=True)
    if request.output.push == "merged" and isinstance(trained, PeftModel) and is_sharded(trained):
        save_merged(
            trained, request.model, artifact, main
        )  # the adapter merged into a whole base on the host (sharding.py)
    else:
        if request.output.push == "merged" and isinstance(trained, PeftModel):
            trained = trained.merge_and_unload()
        # A sharded model's full weights are gathered from every rank's shard as it saves: each
        # rank takes part, rank 0 writes.
        trained.save_pretrained(artifact, is_main_process=main, **saved_adapters(trained))  # not the reference
    if not main:
        return
    assert trainer.processing_class is not None, "every handler gives its trainer a tokenizer or processor"
    trainer.processing_class.save_pretrained(artifact)


def final_metrics(trainer: Trainer, summary: dict[str, Any], loss_key: str = "loss") -> dict[str, float]:
    """What a `succeeded` event reports of training: the trainer's summary (`train_runtime`, ...),
    the first and last logged loss (`loss_key`: PPO logs its policy loss under its own name), the
    number of processes, what each holds of the model and, in a job of several, each one's tokens/s (`JobCallback`),
    and the median seconds between optimizer steps (`StepClock`)."""
    metrics = {k: float(v) for k, v in summary.items() if isinstance(v, int | float)}
    losses = [entry[loss_key] for entry in trainer.state.log_history if loss_key in entry]
    if losses:
        metrics["first_loss"], metrics["final_loss"] = float(losses[0]), float(losses[-1])
    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    if evaluations:  # the last evaluation's loss, so a separate eval set shows in `succeeded`
        metrics["eval_loss"] = float(evaluations[-1]["eval_loss"])
    metrics["world_size"] = float(trainer.args.world_size)
    assert trainer.model is not None, "every handler gives its trainer a model"
    metrics.update(rank_holdings(trainer.model))  # what each process holds of the model: a whole copy, or its shard
    # The modules that recompute their activations in the backward pass (transformers marks each checkpointed layer):
    # 0 without activation checkpointing; what shows it is in force on a sharded model as on a whole one.
    metrics["checkpointed_modules"] = float(
        sum(bool(getattr(module, "gradient_checkpointing", False)) for module in trainer.model.modules())
    )
    # a frozen reference the trainer loaded or was given (DPO, KTO, GRPO): only those trainers have one
    reference = getattr(trainer, "ref_model", None)
    if isinstance(reference, torch.nn.Module):
        metrics.update(rank_holdings(reference, "ref_"))
    clocks = [c for c in trainer.callback_handler.callbacks if isinstance(c, StepClock)]
    for callback in [c for c in clocks if isinstance(c, JobCallback)][:1]:
        metrics.update(callback.rank_metrics(trainer.args))  # each rank's tokens/s, in a job of several processes
    if clocks and (median := clocks[0].median_step_s()) is not None:
        metrics["median_step_s"] = median  # the steady pace, the first step's set-up left out
    return metrics


def tracked_runs(job: JobSpec, trainer: Trainer) -> list[TrackedRun]:
    """The tracker runs this job reported to: its TensorBoard folder (named by the request id, under
    the operator's tensorboard_dir), its Trackio run (transformers' TrackioCallback names it by
    run_name, in the project training.project names, in the operator's trackio_dir), and MLflow's
    last run in this process (MLflowCallback started and ended it) with its page in the tracking
    server's UI."""
    runs = []
    if "tensorboard" in job.report_to and job.tensorboard_dir is not None:  # a folder per request id (runner.py)
        runs.append(TrackedRun(tracker="tensorboard", run_id=str(job.request["request_id"])))
    if "trackio" in job.report_to:
        runs.append(TrackedRun(tracker="trackio", run_id=str(trainer.args.run_name), project=str(trainer.args.project)))
    if "mlflow" in job.report_to:
        import mlflow  # only where the operator enabled MLflow (the `mlflow` extra)

        run = mlflow.last_active_run()
        if run is not None:
            uri = mlflow.get_tracking_uri().rstrip("/")
            url = (
                f"{uri}/#/experiments/{run.info.experiment_id}/runs/{run.info.run_id}"
                if uri.startswith(("http://", "https://"))
                else None
            )
            runs.append(TrackedRun(tracker="mlflow", run_id=run.info.run_id, url=url))
    return runs
