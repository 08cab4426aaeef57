"""Direct preference optimisation with `trl.DPOTrainer`.

Rows: `chosen` and `rejected` (and usually `prompt`), conversational or plain text. With LoRA the
reference model is the base with the adapter switched off, so no second copy is loaded; `ref_model`
names another one, loaded beside the policy (with LoRA too). With `dpo.precompute_ref_log_probs` TRL
computes the reference's log-probs over the dataset once, before the first step.
"""

from __future__ import annotations

from trl import DPOConfig, DPOTrainer

from handlers.common import (
    JobCallback,
    StatusReporter,
    load_base,
    load_causal_lm,
    load_data,
    load_reference,
    lora_config,
    train_and_save,
    trl_config,
)
from schemas.job import JobSpec, TrainResult
from schemas.request import DPORequest


def train(request: DPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(DPOConfig, request, job, "dpo")
    data = load_data(request, job, reporter)
    base = load_base(request, reporter, data)
    reference = load_reference(request, base)
    trainer = DPOTrainer(
        model=load_causal_lm(base.path, request.model),
        ref_model=reference.model if reference is not None else None,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM"),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base, reference)
