"""Supervised fine-tuning with `trl.SFTTrainer`.

Rows: conversational `messages`, or `prompt` + `completion`, or plain text in `dataset_text_field`
(default `text`). Conversational rows need a tokenizer with a chat template. With an `images` (or
`image`) column the base is a vision-language model, trained with its processor (handlers/toolkit/vision.py).
"""

from __future__ import annotations

from trl import SFTConfig, SFTTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_data, load_policy, policy_lora, train_and_save
from handlers.toolkit.start_from import start_adapter
from handlers.toolkit.training import trl_config
from schemas.request import SFTRequest


def train(request: SFTRequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    config = trl_config(SFTConfig, request, job, "sft")
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    model = load_policy(
        base, request.model, request=request
    )  # sharded across the job's processes where resources.shard asks
    started = start_adapter(model, request, job, reference=False)  # from a published adapter (`start_from`)
    trainer = SFTTrainer(
        model=started if started is not None else model,
        args=config,
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.processing_class,
        peft_config=policy_lora(request.peft, base, model) if started is None else None,
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
