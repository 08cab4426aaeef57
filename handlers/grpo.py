"""Group relative policy optimisation with `trl.GRPOTrainer`.

Rows: `prompt` (plus whatever columns the reward functions read, such as `answer`). Completions are
scored by the reward functions adapterd ships, chosen by name, and/or a reward model by repo id.
"""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer

from handlers.common import (
    JobCallback,
    StatusReporter,
    check_chat_template,
    check_columns,
    check_hardware,
    final_metrics,
    last_checkpoint,
    load_causal_lm,
    load_datasets,
    load_tokenizer,
    lora_config,
    package_versions,
    resolve_model,
    save_artifact,
    trl_config,
)
from handlers.rewards import check_reward_columns, reward_functions
from schemas.job import JobSpec, TrainResult
from schemas.request import GRPORequest

TRAINER = "trl.GRPOTrainer/trl.GRPOConfig"


def train(request: GRPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_hardware(request.model)

    reporter.enter("load_dataset")
    train_dataset, eval_dataset = load_datasets(request.dataset, job)
    check_columns(request, train_dataset)
    check_reward_columns(request.rewards, train_dataset.column_names)

    reporter.enter("load_model")
    model_path, model_revision = resolve_model(request.model)
    reward_model_path = resolve_model(request.rewards.model)[0] if request.rewards.model else None
    reward_funcs, reward_weights = reward_functions(request.rewards, reward_model_path)
    config = trl_config(GRPOConfig, request, job, "grpo", reward_weights=reward_weights)
    tokenizer = load_tokenizer(model_path, request.model)
    check_chat_template(tokenizer, train_dataset, request.model)
    model = load_causal_lm(model_path, request.model)

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM"),
        callbacks=[JobCallback(reporter, job)],
    )

    reporter.enter("train")
    train_output = trainer.train(resume_from_checkpoint=last_checkpoint(job))

    reporter.enter("save")
    save_artifact(trainer, request, job.artifact)
    reporter.enter("done")
    return TrainResult(
        trainer=TRAINER,
        metrics=final_metrics(train_output, trainer),
        base_model_revision=model_revision,
        dataset_fingerprint=train_dataset._fingerprint,
        durations_s=reporter.durations_s,
        versions=package_versions(),
    )
