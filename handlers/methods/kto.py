"""Kahneman-Tversky optimisation with `trl.KTOTrainer`.

Rows: `prompt`, `completion` and a boolean `label` (desirable or not): unpaired preference data.
The reference is the base (with LoRA, the base with the adapter switched off) unless `ref_model`
names another, loaded beside the policy; `kto.precompute_ref_log_probs` computes its log-probs once.
"""

from __future__ import annotations

from trl import KTOConfig, KTOTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.distributed.fsdp import distributed_config
from handlers.toolkit.loading import load_causal_lm
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_data, load_reference, train_and_save
from handlers.toolkit.training import lora_config, trl_config
from schemas.request import KTORequest


def train(request: KTORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(KTOConfig, request, job, "kto")
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    reference = load_reference(request, job, base)
    # Before the trainer: the LoRA patterns are matched on its modules. Sharded across the job's
    # processes where resources.shard asks.
    model = load_causal_lm(base.path, request.model, distributed=distributed_config(request))
    trainer = KTOTrainer(
        model=model,
        ref_model=reference.model if reference is not None else None,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM", model),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base, reference)
