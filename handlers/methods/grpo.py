"""Group relative policy optimisation with `trl.GRPOTrainer`.

Rows: `prompt` (plus whatever columns the reward functions read, such as `answer`). Completions are
scored by the reward functions adapterd ships, chosen by name, and/or a reward model by repo id.
With `grpo.use_vllm` vLLM generates them (handlers/toolkit/vllm_support.py); the preflight fails first on a
host without it. With an `image` (or `images`) column the base is a vision-language model, prompted
with each row's images; the reward functions see the text (handlers/toolkit/vision.py).
"""

from __future__ import annotations

from trl import GRPOConfig, GRPOTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.rewards import check_reward_columns, load_rewards
from handlers.toolkit.sequence import load_base, load_data, load_policy, policy_lora, train_and_save
from handlers.toolkit.start_from import start_adapter
from handlers.toolkit.training import trl_config
from handlers.toolkit.vllm_support import check_vllm, vllm_arguments
from schemas.request import GRPORequest


def train(request: GRPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_vllm(request, job, "grpo")
    data = load_data(request, job, reporter)
    check_reward_columns(request.rewards, data.train.column_names)
    base = load_base(request, job, reporter, data)
    model = load_policy(
        base, request.model, request=request
    )  # sharded across the job's processes where resources.shard asks
    reward_funcs, reward_weights = load_rewards(request.rewards, job)
    # From a published adapter (`start_from`): it is the policy, and with beta > 0 the reference (TRL's `ref` copy).
    started = start_adapter(model, request, job, reference=bool(request.grpo.beta))  # TRL's default beta is 0.0
    trainer = GRPOTrainer(
        model=started if started is not None else model,
        reward_funcs=reward_funcs,
        args=trl_config(
            GRPOConfig, request, job, "grpo", reward_weights=reward_weights, **vllm_arguments(request, job, "grpo")
        ),
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.processing_class,
        peft_config=policy_lora(request.peft, base, model) if started is None else None,
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
