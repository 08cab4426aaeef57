"""The preference methods that train without a reference model (ORPO, CPO), said once: TRL's
trainer built from the policy, the LoRA config and the job's callback, then trained and saved.

Each method keeps its own module (handlers/methods/experimental/orpo.py, handlers/methods/experimental/cpo.py) naming
its TRL classes and calling `train_reference_free` explicitly; what they share is only this sequence.
"""

from __future__ import annotations

from typing import Any

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.loading import load_causal_lm
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_data, train_and_save
from handlers.toolkit.training import lora_config, trl_config
from schemas.request import RequestBase


def train_reference_free(
    trainer_class: Any, config_class: Any, request: RequestBase, job: JobSpec, reporter: StatusReporter, block: str
) -> TrainResult:
    """Train `request` with `trainer_class` and its `config_class`, the config's fields from the
    request's `block` (its method's name)."""
    config = trl_config(config_class, request, job, block)
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    model = load_causal_lm(base.path, request.model)  # before the trainer: the LoRA patterns are matched on its modules
    trainer = trainer_class(
        model=model,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM", model),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
