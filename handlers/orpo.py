"""Experimental: odds ratio preference optimisation with `trl.experimental.orpo.ORPOTrainer`.

Rows: `chosen` and `rejected` (and usually `prompt`). No reference model: ORPO adds the preference
term to the SFT loss. TRL's experimental API may change between releases.
"""

from __future__ import annotations

from trl.experimental.orpo import ORPOConfig, ORPOTrainer

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
from schemas.request import ORPORequest


def train(request: ORPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(ORPOConfig, request, job, "orpo")
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    trainer = ORPOTrainer(
        model=load_causal_lm(base.path, request.model),
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM"),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
