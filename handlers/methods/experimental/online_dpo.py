"""Experimental: online DPO with `trl.experimental.online_dpo.OnlineDPOTrainer`.

Rows: `prompt` (plus whatever columns the reward functions read, such as `answer`). The policy
writes two answers to each prompt; the reward functions adapterd ships (chosen by name) and/or a
reward model by repo id, from the same registry and host policy as GRPO's, say which one is
preferred, and the pair trains the policy as DPO does, against the base with its adapter switched
off. With `online_dpo.use_vllm` vLLM generates them, after the same preflight as GRPO's. TRL's
experimental API may change between releases.
"""

from __future__ import annotations

from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit.callbacks import JobCallback
from handlers.toolkit.loading import load_causal_lm
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.rewards import check_reward_columns, load_rewards
from handlers.toolkit.sequence import load_base, load_data, train_and_save
from handlers.toolkit.training import lora_config, trl_config
from handlers.toolkit.vllm_support import check_vllm, vllm_arguments
from schemas.request import OnlineDPORequest


def train(request: OnlineDPORequest, job: JobSpec, reporter: StatusReporter) -> TrainResult:
    check_vllm(request, job, "online_dpo")
    data = load_data(request, job, reporter)
    check_reward_columns(request.rewards, data.train.column_names)
    base = load_base(request, job, reporter, data)
    reward_funcs, reward_weights = load_rewards(request.rewards, job)
    model = load_causal_lm(base.path, request.model)  # before the trainer: the LoRA patterns are matched on its modules
    trainer = OnlineDPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=trl_config(
            OnlineDPOConfig,
            request,
            job,
            "online_dpo",
            reward_weights=reward_weights,
            **vllm_arguments(request, job, "online_dpo"),
        ),
        train_dataset=data.train,
        eval_dataset=data.eval,
        processing_class=base.tokenizer,
        peft_config=lora_config(request.peft, "CAUSAL_LM", model),
        callbacks=[JobCallback(reporter, job)],
    )
    return train_and_save(trainer, request, job, reporter, data, base)
