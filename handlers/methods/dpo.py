"""Direct preference optimisation with `trl.DPOTrainer`.

Rows: `chosen` and `rejected` (and usually `prompt`), conversational or plain text. With LoRA the
reference model is the base with the adapter switched off, so no second copy is loaded; `ref_model`
names another one, loaded beside the policy (with LoRA too). With `dpo.precompute_ref_log_probs` TRL
computes the reference's log-probs over the dataset once, before the first step. With an `images` (or
`image`) column the base is a vision-language model, trained with its processor (handlers/toolkit/vision.py).
"""

from __future__ import annotations

from trl import DPOConfig, DPOTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_data, load_policy, load_reference, policy_lora, train_and_save
from handlers.toolkit.start_from import start_adapter
from handlers.toolkit.training import trl_config
from schemas.request import DPORequest


def train(request: DPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(DPOConfig, request, job, "dpo")
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    model = load_policy(
        base, request.model, request=request
    )  # sharded across the job's processes where resources.shard asks
    reference = load_reference(request, job, base)
    # From a published adapter (`start_from`): it is the policy, and the reference where no ref_model is named.
    started = start_adapter(model, request, job, reference=reference is None)
    trainer = DPOTrainer(
        model=started if started is not None else model,
        ref_model=reference.model if reference is not None else None,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.processing_class,
        peft_config=policy_lora(request.peft, base, model) if started is None else None,
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base, reference)
