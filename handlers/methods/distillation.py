"""On-policy knowledge distillation with `trl.DistillationTrainer`.

Rows: `prompt`. The student (the base with its LoRA adapter) writes the completions itself (with
`distillation.use_vllm`, vLLM does, after the same preflight as GRPO's) and is trained to match the
teacher's next-token distribution on them (a generalised Jensen-Shannon divergence, `beta`). The
teacher is `teacher_model`, checked by the host's model policy like the base, loaded like it, and it
must share the base model's tokenizer.
"""

from __future__ import annotations

from trl import DistillationConfig, DistillationTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.sequence import load_base, load_beside_base, load_data, load_policy, policy_lora, train_and_save
from handlers.toolkit.training import trl_config
from handlers.toolkit.vllm_support import check_vllm, vllm_arguments
from schemas.request import DistillationRequest


def train(request: DistillationRequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_vllm(request, job, "distillation")
    data = load_data(request, job, reporter)
    base = load_base(request, job, reporter, data)
    model = load_policy(base, request.model)
    teacher = load_beside_base(request, job, base, request.teacher_model, "teacher_model", "the teacher")
    trainer = DistillationTrainer(
        model=model,
        teacher_model=teacher.model,
        args=trl_config(
            DistillationConfig, request, job, "distillation", **vllm_arguments(request, job, "distillation")
        ),
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.processing_class,
        peft_config=policy_lora(request.peft, base, model),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base, teacher=teacher)
