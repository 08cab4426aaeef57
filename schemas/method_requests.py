"""Each method's request: its own block of TRL config fields (`trl.SFTConfig` names for `sft`, and so
on) and the dataset columns it accepts. Which TRL trainer runs it, and on which TRL, is in the
method table (schemas/methods.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from schemas.common import Frozen
from schemas.request_base import RequestBase
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


class KTOSpec(Frozen):
    """`trl.KTOConfig` fields specific to Kahneman-Tversky optimisation."""

    beta: float | None = Field(None, gt=0)
    loss_type: Literal["kto", "apo_zero_unpaired"] | None = None
    desirable_weight: float | None = Field(None, gt=0)
    undesirable_weight: float | None = Field(None, gt=0)
    max_length: int | None = Field(None, ge=1)


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


class RLOOSpec(Frozen):
    """`trl.RLOOConfig` fields specific to REINFORCE leave-one-out."""

    num_generations: int | None = Field(None, ge=2)
    max_completion_length: int | None = Field(None, ge=1)
    beta: float | None = Field(None, ge=0)
    temperature: float | None = Field(None, gt=0)
    num_iterations: int | None = Field(None, ge=1)
    epsilon: float | None = Field(None, gt=0)
    normalize_advantages: bool | None = None


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

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class KTORequest(RequestBase):
    """Kahneman-Tversky optimisation with `trl.KTOTrainer`. Rows: `prompt`, `completion`, `label` (bool)."""

    method: Literal["kto"]
    kto: KTOSpec = Field(default_factory=KTOSpec)

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

