"""Experimental: proximal policy optimisation with `trl.experimental.ppo.PPOTrainer`.

Only on trl 1.10 to 1.12.0: TRL removed PPO in 1.13.0 (huggingface/trl#7020); on newer TRL,
online RL against a learned reward model goes through `grpo` and `rloo`.
Rows: `prompt`. The policy is the base with LoRA (its reference is the same base with the adapter
off); the value model is the base with a one-label value head; the reward model is a sequence
classifier by repo id, e.g. the merged output of a `reward` request.
"""

from __future__ import annotations

from typing import Any

from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    PreTrainedTokenizerBase,
    TrainerCallback,
)
from trl.experimental.ppo import PPOConfig, PPOTrainer

from handlers.common import (
    JobCallback,
    StatusReporter,
    check_chat_template,
    check_columns,
    check_hardware,
    is_conversational,
    load_causal_lm,
    load_datasets,
    load_sequence_classifier,
    load_tokenizer,
    lora_config,
    package_versions,
    resolve_model,
    save_artifact,
    trl_config,
)
from schemas.job import JobFailed, JobSpec, TrainResult
from schemas.request import PPORequest

TRAINER = "trl.experimental.ppo.PPOTrainer/trl.experimental.ppo.PPOConfig"


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
            return {"input_ids": tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True)}
        return {"input_ids": tokenizer(row["prompt"]).input_ids}

    return dataset.map(tokenize, remove_columns=dataset.column_names)


def load_reward_model(request: PPORequest) -> Any:
    path, _ = resolve_model(request.reward_model)
    try:
        return AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model",
            f"reward_model.id: {request.reward_model.id} is not a full sequence classifier (push a reward model 'merged'): {exc}",
        ) from exc


def train(request: PPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_hardware(request.model)
    config = trl_config(PPOConfig, request, job, "ppo", num_sample_generations=0)

    reporter.enter("load_dataset")
    train_dataset, _ = load_datasets(request.dataset, job)
    check_columns(request, train_dataset)

    reporter.enter("load_model")
    model_path, model_revision = resolve_model(request.model)
    tokenizer = load_tokenizer(model_path, request.model)
    check_chat_template(tokenizer, train_dataset, request.model)
    policy = load_causal_lm(model_path, request.model)
    value_model = load_sequence_classifier(model_path, request.model, tokenizer)
    reward_model = load_reward_model(request)
    stop = StopAtKL(request.kl_early_stop.target_kl) if request.kl_early_stop else None

    trainer = PPOTrainer(
        args=config,
        processing_class=tokenizer,
        model=policy,
        ref_model=None,
        reward_model=reward_model,
        train_dataset=tokenize_prompts(train_dataset, tokenizer),
        value_model=value_model,
        peft_config=lora_config(request.peft, "CAUSAL_LM"),
        callbacks=[JobCallback(reporter, job), *([stop] if stop else [])],
    )

    reporter.enter("train")
    try:
        trainer.train()
    except KLLimitReached:
        pass

    reporter.enter("save")
    save_artifact(trainer, request, job.artifact, model=trainer.model.policy)
    reporter.enter("done")
    logged = [entry for entry in trainer.state.log_history if "objective/kl" in entry]
    metrics = {key: float(value) for key, value in (logged[-1] if logged else {}).items() if isinstance(value, int | float)}
    metrics["steps"] = float(trainer.state.global_step)
    metrics["total_steps"] = float(trainer.state.max_steps)
    if stop is not None and stop.stopped_at is not None:
        metrics["kl_early_stop_step"], metrics["kl_at_stop"] = float(stop.stopped_at[0]), stop.stopped_at[1]
    return TrainResult(
        trainer=TRAINER,
        metrics=metrics,
        base_model_revision=model_revision,
        dataset_fingerprint=train_dataset._fingerprint,
        durations_s=reporter.durations_s,
        versions=package_versions(),
    )
