"""Supervised fine-tuning with `trl.SFTTrainer`.

Rows: conversational `messages`, or `prompt` + `completion`, or plain text in `dataset_text_field`
(default `text`). Conversational rows need a tokenizer with a chat template.
"""

from __future__ import annotations

from trl import SFTConfig, SFTTrainer

from handlers.common import (
    JobCallback,
    StatusReporter,
    load_base,
    load_causal_lm,
    load_data,
    lora_config,
    train_and_save,
    trl_config,
)
from schemas.job import JobSpec, TrainResult
from schemas.request import SFTRequest


def train(request: SFTRequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(SFTConfig, request, job, "sft")
    data = load_data(request, job, reporter)
    base = load_base(request, reporter, data)
    trainer = SFTTrainer(
        model=load_causal_lm(base.path, request.model),
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM"),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
