"""Experimental: proximal policy optimisation with `trl.experimental.ppo.PPOTrainer`.

Only on trl 1.10 to 1.12.0: TRL removed PPO in 1.13.0 (huggingface/trl#7020); on newer TRL,
online RL against a learned reward model goes through `grpo` and `rloo`.
Rows: `prompt`. The policy is the base with LoRA (its reference is the same base with the adapter
off); the value model is the base with a one-label value head; the reward model is a sequence
classifier by repo id, e.g. the merged output of a `reward` request.

PPOTrainer has its own loop (`train()` takes no checkpoint and ignores `should_training_stop`), so
this handler does by hand what `train_and_save` gets from `Trainer`: see
handlers/methods/experimental/ppo_checkpoints.py.
"""

from __future__ import annotations

import time
from typing import Any

from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TrainerCallback,
)
from trl.experimental.ppo import PPOConfig, PPOTrainer

from handlers.methods.experimental.ppo_checkpoints import PPOCheckpoints
from handlers.protocol import JobFailed, JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.loading import DTYPES, is_conversational, load_causal_lm, load_sequence_classifier, resolve_model
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_data, result
from handlers.toolkit.training import final_metrics, last_checkpoint, lora_config, save_artifact, trl_config
from schemas.request import PPORequest


class KLLimitReached(Exception):
    """Raised from a callback: PPOTrainer's loop ignores `control.should_training_stop`."""


class StopAtKL(TrainerCallback):
    def __init__(self, target_kl: float) -> None:
        self.target_kl = target_kl
        self.stopped_at: tuple[int, float] | None = None

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        kl = (logs or {}).get("objective/kl")
        if kl is not None and kl > self.target_kl:
            self.stopped_at = (state.global_step, float(kl))
            raise KLLimitReached


def tokenize_prompts(dataset: Dataset, tokenizer: PreTrainedTokenizerBase) -> Dataset:
    """PPOTrainer takes prompts as `input_ids`: plain text, or chat messages through the template."""
    conversational = is_conversational(dataset)

    def tokenize(row: dict[str, Any]) -> dict[str, Any]:
        if conversational:
            return {
                "input_ids": tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)
            }
        return {"input_ids": tokenizer(row["prompt"]).input_ids}

    return dataset.map(tokenize, remove_columns=dataset.column_names)


def load_reward_model(request: PPORequest, job: JobSpec) -> PreTrainedModel:
    """The reward model, in the request's dtype and under its remote-code choice (which policy allowed)."""
    path, _ = resolve_model(request.reward_model, "reward_model", max_bytes=job.max_model_bytes)
    try:
        return AutoModelForSequenceClassification.from_pretrained(
            path,
            num_labels=1,
            dtype=DTYPES.get(request.model.dtype, "auto"),
            trust_remote_code=request.model.trust_remote_code,
        )
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable",
            "load_model",
            f"reward_model.id: {request.reward_model.id} is not a full sequence classifier (push "
            f"a reward model 'merged'): {exc}",
        ) from exc


def train(request: PPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(PPOConfig, request, job, "ppo", num_sample_generations=0)
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    value_model = load_sequence_classifier(base.path, request.model, base.tokenizer)
    checkpoints = PPOCheckpoints(value_model)
    stop = StopAtKL(request.kl_early_stop.target_kl) if request.kl_early_stop else None
    model = load_causal_lm(base.path, request.model)  # before the trainer: the LoRA patterns are matched on its modules
    trainer = PPOTrainer(
        args=config,
        processing_class=base.tokenizer,
        model=model,
        ref_model=None,
        reward_model=load_reward_model(request, job),
        train_dataset=tokenize_prompts(data.train, base.tokenizer),
        eval_dataset=tokenize_prompts(data.eval, base.tokenizer) if data.eval is not None else None,
        value_model=value_model,
        peft_config=lora_config(request.peft, "CAUSAL_LM", model),
        # PPOCheckpoints first: it must write the value head before JobCallback may exit at a stop.
        callbacks=[checkpoints, JobCallback(reporter, job), *([stop] if stop else [])],
    )

    reporter.enter("train")
    started = time.monotonic()
    checkpoints.resume(trainer, last_checkpoint(job))
    try:
        trainer.train()
    except KLLimitReached:
        pass

    reporter.enter("save")
    save_artifact(trainer, request, job.artifact, model=trainer.model.policy)
    state = trainer.state
    metrics = final_metrics(
        trainer, {"train_runtime": time.monotonic() - started, "epoch": state.epoch}, loss_key="loss/policy_avg"
    )
    logged = [entry for entry in state.log_history if "objective/kl" in entry]
    metrics.update(
        {key: float(value) for key, value in (logged[-1] if logged else {}).items() if isinstance(value, int | float)}
    )
    metrics["steps"], metrics["total_steps"] = float(state.global_step), float(state.max_steps)
    if checkpoints.resumed_from is not None:
        metrics["resumed_from_step"] = float(checkpoints.resumed_from)
    if stop is not None and stop.stopped_at is not None:
        metrics["kl_early_stop_step"], metrics["kl_at_stop"] = float(stop.stopped_at[0]), stop.stopped_at[1]
    return result(request, reporter, data, base, metrics)
