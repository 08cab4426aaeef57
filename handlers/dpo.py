"""Direct preference optimisation with `trl.DPOTrainer`.

Rows: `chosen` and `rejected` (and usually `prompt`), conversational or plain text. With LoRA the
reference model is the base with the adapter switched off, so no second copy is loaded.
"""

from __future__ import annotations

from trl import DPOConfig, DPOTrainer

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
from schemas.job import JobSpec, TrainResult
from schemas.request import DPORequest

TRAINER = "trl.DPOTrainer/trl.DPOConfig"


def train(request: DPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_hardware(request.model)
    config = trl_config(DPOConfig, request, job, "dpo")

    reporter.enter("load_dataset")
    train_dataset, eval_dataset = load_datasets(request.dataset, job)
    check_columns(request, train_dataset)

    reporter.enter("load_model")
    model_path, model_revision = resolve_model(request.model)
    tokenizer = load_tokenizer(model_path, request.model)
    check_chat_template(tokenizer, train_dataset, request.model)
    model = load_causal_lm(model_path, request.model)

    trainer = DPOTrainer(
        model=model,
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
