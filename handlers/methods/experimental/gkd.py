"""Experimental: generalised knowledge distillation with `trl.experimental.gkd.GKDTrainer`.

Rows: `messages`. The student (the base with its LoRA adapter) is trained to match the teacher's
next-token distribution (a generalised Jensen-Shannon divergence, `beta`) on the rows' answers and,
for a share `lmbda` of the batches, on answers it writes itself. The teacher is `teacher_model`,
checked by the host's model policy like the base, loaded like it; it must share the base model's
tokenizer. TRL's experimental API may change between releases.
"""

from __future__ import annotations

from trl.experimental.gkd import GKDConfig, GKDTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_beside_base, load_data, load_policy, policy_lora, train_and_save
from handlers.toolkit.training import trl_config
from schemas.request import GKDRequest


def train(request: GKDRequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    model = load_policy(base, request.model)
    teacher = load_beside_base(request, job, base, request.teacher_model, "teacher_model", "the teacher")
    trainer = GKDTrainer(
        model=model,
        teacher_model=teacher.model,
        args=trl_config(GKDConfig, request, job, "gkd"),
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.processing_class,
        peft_config=policy_lora(request.peft, base, model),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base, teacher=teacher)
