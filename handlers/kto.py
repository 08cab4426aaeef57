"""Kahneman-Tversky optimisation with `trl.KTOTrainer`.

Rows: `prompt`, `completion` and a boolean `label` (desirable or not): unpaired preference data.
"""

from __future__ import annotations

from trl import KTOConfig, KTOTrainer

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
from schemas.request import KTORequest


def train(request: KTORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(KTOConfig, request, job, "kto")
    data = load_data(request, job, reporter)
    base = load_base(request, reporter, data)
    trainer = KTOTrainer(
        model=load_causal_lm(base.path, request.model),
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM"),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
