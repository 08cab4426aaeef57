"""Reward modelling with `trl.RewardTrainer`: a one-label sequence classification head on the base.

Rows: `chosen` and `rejected` (and optionally `prompt`). The result scores text; `grpo`, `rloo` and
`ppo` requests can name it by repo id as their reward model.
"""

from __future__ import annotations

from trl import RewardConfig, RewardTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.distributed.fsdp import distributed_config
from handlers.toolkit.loading import load_sequence_classifier
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_data, train_and_save
from handlers.toolkit.training import lora_config, trl_config
from schemas.request import RewardRequest


def train(request: RewardRequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(RewardConfig, request, job, "reward")
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    # Before the trainer: the LoRA patterns are matched on its modules. Sharded across the job's
    # processes where resources.shard asks.
    model = load_sequence_classifier(base.path, request.model, base.tokenizer, distributed_config(request))
    trainer = RewardTrainer(
        model=model,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "SEQ_CLS", model),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
