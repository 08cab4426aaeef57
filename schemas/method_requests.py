"""Each method's request: its own block of TRL config fields (`trl.SFTConfig` names for `sft`, and so
on) and the dataset columns it accepts. Which TRL trainer runs it, and on which TRL, is in the
method table (schemas/methods.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from schemas.common import Frozen
from schemas.request_base import MODEL_ID_PATTERN, RequestBase
from schemas.rewards import OnlineRewards, RewardModelSpec


class SFTSpec(Frozen):
    """`trl.SFTConfig` fields specific to supervised fine-tuning."""

    max_length: int | None = Field(None, ge=1)
    packing: bool | None = None
    completion_only_loss: bool | None = None
    assistant_only_loss: bool | None = None
    dataset_text_field: str | None = None


class DPOSpec(Frozen):
    """`trl.DPOConfig` fields specific to direct preference optimisation."""

    beta: float | None = Field(None, gt=0)
    loss_type: list[Literal[
        "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot",
        "aot_unpaired", "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
    ]] | None = Field(None, min_length=1)
    loss_weights: list[float] | None = None
    label_smoothing: float | None = Field(None, ge=0, le=0.5)
    max_length: int | None = Field(None, ge=1)
    truncation_mode: Literal["keep_start", "keep_end"] | None = None
    # hand-added for vllm-ref; the generated blocks replace this
    precompute_ref_log_probs: bool | None = None
    precompute_ref_batch_size: int | None = Field(None, ge=1)


class KTOSpec(Frozen):
    """`trl.KTOConfig` fields specific to Kahneman-Tversky optimisation."""

    beta: float | None = Field(None, gt=0)
    loss_type: Literal["kto", "apo_zero_unpaired"] | None = None
    desirable_weight: float | None = Field(None, gt=0)
    undesirable_weight: float | None = Field(None, gt=0)
    max_length: int | None = Field(None, ge=1)
    # hand-added for vllm-ref; the generated blocks replace this
    precompute_ref_log_probs: bool | None = None
    precompute_ref_batch_size: int | None = Field(None, ge=1)


class RewardSpec(Frozen):
    """`trl.RewardConfig` fields specific to reward modelling."""

    max_length: int | None = Field(None, ge=1)
    center_rewards_coefficient: float | None = Field(None, ge=0)


class ORPOSpec(Frozen):
    """`trl.experimental.orpo.ORPOConfig` fields specific to ORPO."""

    beta: float | None = Field(None, gt=0)
    max_length: int | None = Field(None, ge=1)
    max_completion_length: int | None = Field(None, ge=1)


class GRPOSpec(Frozen):
    """`trl.GRPOConfig` fields specific to group relative policy optimisation."""

    num_generations: int | None = Field(None, ge=2)
    max_completion_length: int | None = Field(None, ge=1)
    beta: float | None = Field(None, ge=0)
    temperature: float | None = Field(None, gt=0)
    num_iterations: int | None = Field(None, ge=1)
    epsilon: float | None = Field(None, gt=0)
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] | None = None
    scale_rewards: Literal["group", "batch", "none"] | None = None
    # hand-added for vllm-ref; the generated blocks replace this
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    use_vllm: bool | None = None
    vllm_mode: Literal["colocate", "server"] | None = None
    vllm_gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    vllm_tensor_parallel_size: int | None = Field(None, ge=1)
    vllm_max_model_length: int | None = Field(None, ge=1)
    vllm_enable_sleep_mode: bool | None = None


class RLOOSpec(Frozen):
    """`trl.RLOOConfig` fields specific to REINFORCE leave-one-out."""

    num_generations: int | None = Field(None, ge=2)
    max_completion_length: int | None = Field(None, ge=1)
    beta: float | None = Field(None, ge=0)
    temperature: float | None = Field(None, gt=0)
    num_iterations: int | None = Field(None, ge=1)
    epsilon: float | None = Field(None, gt=0)
    normalize_advantages: bool | None = None
    # hand-added for vllm-ref; the generated blocks replace this
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    repetition_penalty: float | None = Field(None, gt=0)
    use_vllm: bool | None = None
    vllm_mode: Literal["colocate", "server"] | None = None
    vllm_gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    vllm_tensor_parallel_size: int | None = Field(None, ge=1)
    vllm_max_model_length: int | None = Field(None, ge=1)
    vllm_enable_sleep_mode: bool | None = None


class PPOSpec(Frozen):
    """`trl.experimental.ppo.PPOConfig` fields (trl 1.10 to 1.12)."""

    kl_coef: float | None = Field(None, ge=0)
    cliprange: float | None = Field(None, gt=0)
    vf_coef: float | None = Field(None, ge=0)
    num_ppo_epochs: int | None = Field(None, ge=1)
    num_mini_batches: int | None = Field(None, ge=1)
    response_length: int | None = Field(None, ge=1)
    total_episodes: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, gt=0)
    missing_eos_penalty: float | None = None


class KLEarlyStopSpec(Frozen):
    """adapterd's own guard for PPO: stop training once the policy's KL to the reference exceeds `target_kl`."""

    target_kl: float = Field(gt=0)


class ReferenceModelSpec(Frozen):
    """DPO's and KTO's frozen reference model, when it is not the base model itself (e.g. the SFT model
    the base was tuned from). Loaded like the base: its dtype, quantization and trust_remote_code; it must
    share the base model's tokenizer."""

    id: str = Field(pattern=MODEL_ID_PATTERN, description="Hub repo id, or an absolute local path the operator allows.")
    revision: str | None = Field(None, description="Branch, tag or commit sha on the Hub; the default branch when absent.")


def _reference_problem(request: RequestBase, block: str) -> str | None:
    """Why the reference settings of a DPO or KTO request cannot work, or None. TRL computes reference
    log-probs ahead (`precompute_ref_log_probs`) only over a map-style dataset, never a stream."""
    if request.set_fields(block).get("precompute_ref_log_probs") and request.dataset.streaming:
        return f"{block}.precompute_ref_log_probs: a streaming dataset cannot have its reference log-probs computed ahead; set dataset.streaming false or leave precompute_ref_log_probs out"
    return None


class SFTRequest(RequestBase):
    """Supervised fine-tuning with `trl.SFTTrainer`. Rows: `messages`, `prompt`+`completion`, or `text`."""

    method: Literal["sft"]
    sft: SFTSpec = Field(default_factory=SFTSpec)

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"messages"}), frozenset({"prompt", "completion"}), frozenset({self.sft.dataset_text_field or "text"}))


class DPORequest(RequestBase):
    """Direct preference optimisation with `trl.DPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    method: Literal["dpo"]
    dpo: DPOSpec = Field(default_factory=DPOSpec)
    ref_model: ReferenceModelSpec | None = Field(None, description=(
        "The reference model; absent: the base itself (with LoRA, the base with the adapter switched off)."
    ))

    @model_validator(mode="after")
    def _reference_fits(self) -> DPORequest:
        problem = _reference_problem(self, "dpo")
        if problem:
            raise ValueError(problem)
        return self

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class KTORequest(RequestBase):
    """Kahneman-Tversky optimisation with `trl.KTOTrainer`. Rows: `prompt`, `completion`, `label` (bool)."""

    method: Literal["kto"]
    kto: KTOSpec = Field(default_factory=KTOSpec)
    ref_model: ReferenceModelSpec | None = Field(None, description=(
        "The reference model; absent: the base itself (with LoRA, the base with the adapter switched off)."
    ))

    @model_validator(mode="after")
    def _reference_fits(self) -> KTORequest:
        problem = _reference_problem(self, "kto")
        if problem:
            raise ValueError(problem)
        return self

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt", "completion", "label"}),)


class RewardRequest(RequestBase):
    """Reward modelling with `trl.RewardTrainer` (sequence classification head). Rows: `chosen`, `rejected`."""

    method: Literal["reward"]
    reward: RewardSpec = Field(default_factory=RewardSpec)

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class GRPORequest(RequestBase):
    """Group relative policy optimisation with `trl.GRPOTrainer`. Rows: `prompt` (plus reward columns)."""

    method: Literal["grpo"]
    grpo: GRPOSpec = Field(default_factory=GRPOSpec)
    rewards: OnlineRewards

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)


class RLOORequest(RequestBase):
    """REINFORCE leave-one-out with `trl.RLOOTrainer`. Rows: `prompt` (plus reward columns)."""

    method: Literal["rloo"]
    rloo: RLOOSpec = Field(default_factory=RLOOSpec)
    rewards: OnlineRewards

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)


class ORPORequest(RequestBase):
    """Experimental: ORPO with `trl.experimental.orpo.ORPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    method: Literal["orpo"]
    orpo: ORPOSpec = Field(default_factory=ORPOSpec)

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class PPORequest(RequestBase):
    """Experimental: PPO with `trl.experimental.ppo.PPOTrainer` (trl 1.10 to 1.12 only). Rows: `prompt`.
    The reward model is a sequence classifier by repo id, e.g. the output of a `reward` request."""

    method: Literal["ppo"]
    ppo: PPOSpec = Field(default_factory=PPOSpec)
    reward_model: RewardModelSpec
    kl_early_stop: KLEarlyStopSpec | None = None

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)

