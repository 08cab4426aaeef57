"""Reward modelling with `trl.RewardTrainer`: a one-label sequence classification head on the base.

Rows: `chosen` and `rejected` (and optionally `prompt`). The result scores text; `grpo`, `rloo` and
`ppo` requests can name it by repo id as their reward model.
"""

from __future__ import annotations

from trl import RewardConfig, RewardTrainer

from handlers.common import (
    JobCallback,
    StatusReporter,
    check_chat_template,
    check_columns,
    check_hardware,
    final_metrics,
    last_checkpoint,
    load_datasets,
    load_sequence_classifier,
    load_tokenizer,
    lora_config,
    package_versions,
    resolve_model,
    save_artifact,
    trl_config,
)
from schemas.job import JobSpec, TrainResult
from schemas.request import RewardRequest

TRAINER = "trl.RewardTrainer/trl.RewardConfig"


def train(request: RewardRequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_hardware(request.model)
    config = trl_config(RewardConfig, request, job, "reward")

    reporter.enter("load_dataset")
    train_dataset, eval_dataset = load_datasets(request.dataset, job)
    check_columns(request, train_dataset)

    reporter.enter("load_model")
    model_path, model_revision = resolve_model(request.model)
    tokenizer = load_tokenizer(model_path, request.model)
    check_chat_template(tokenizer, train_dataset, request.model)
    model = load_sequence_classifier(model_path, request.model, tokenizer)

    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        processing_class=tokenizer,
        peft_config=lora_config(request.peft, "SEQ_CLS"),
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
