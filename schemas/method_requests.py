"""Each method's request: its own block of TRL config fields (every `trl.SFTConfig` field that is
not a `TrainingArguments` one for `sft`, and so on; generated: schemas/trl_fields.py) and the
dataset columns it accepts. Which TRL trainer runs it, and on which TRL, is in the
method table (schemas/methods.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from .common import Frozen, HubRevision
from .request_base import MODEL_ID_PATTERN, RequestBase
from .rewards import OnlineRewards, RewardModelSpec
from .trl_fields import (
    CPOConfigFields,
    DistillationConfigFields,
    DPOConfigFields,
    GKDConfigFields,
    GRPOConfigFields,
    KTOConfigFields,
    OnlineDPOConfigFields,
    ORPOConfigFields,
    PPOConfigFields,
    RewardConfigFields,
    RLOOConfigFields,
    SFTConfigFields,
)


class SFTSpec(SFTConfigFields):
    """`trl.SFTConfig` fields specific to supervised fine-tuning."""


class DPOSpec(DPOConfigFields):
    """`trl.DPOConfig` fields specific to direct preference optimisation."""


class KTOSpec(KTOConfigFields):
    """`trl.KTOConfig` fields specific to Kahneman-Tversky optimisation."""


class RewardSpec(RewardConfigFields):
    """`trl.RewardConfig` fields specific to reward modelling."""


class ORPOSpec(ORPOConfigFields):
    """`trl.experimental.orpo.ORPOConfig` fields specific to ORPO."""


class DistillationSpec(DistillationConfigFields):
    """`trl.DistillationConfig` fields specific to on-policy distillation."""


class GKDSpec(GKDConfigFields):
    """`trl.experimental.gkd.GKDConfig` fields specific to GKD (with the `trl.SFTConfig` ones it extends)."""


class OnlineDPOSpec(OnlineDPOConfigFields):
    """`trl.experimental.online_dpo.OnlineDPOConfig` fields specific to online DPO."""


class CPOSpec(CPOConfigFields):
    """`trl.experimental.cpo.CPOConfig` fields specific to CPO."""


class GRPOSpec(GRPOConfigFields):
    """`trl.GRPOConfig` fields specific to group relative policy optimisation."""


class RLOOSpec(RLOOConfigFields):
    """`trl.RLOOConfig` fields specific to REINFORCE leave-one-out."""


class PPOSpec(PPOConfigFields):
    """`trl.experimental.ppo.PPOConfig` fields specific to PPO (generated from trl 1.12)."""


class KLEarlyStopSpec(Frozen):
    """adapterd's own guard for PPO: stop training once the policy's KL to the reference exceeds `target_kl`."""

    target_kl: float = Field(gt=0)


class ReferenceModelSpec(Frozen):
    """DPO's and KTO's frozen reference model, when it is not the base model itself (e.g. the SFT model
    the base was tuned from). Loaded like the base: its dtype, quantization and trust_remote_code; it must
    share the base model's tokenizer."""

    id: str = Field(pattern=MODEL_ID_PATTERN, description="Hub repo id, or an absolute local path the operator allows.")
    revision: HubRevision = Field(
        None, description="Branch, tag or commit sha on the Hub; the default branch when absent."
    )


class TeacherModelSpec(ReferenceModelSpec):
    """Distillation's and GKD's teacher, whose next-token distribution the student learns: checked by the host's
    model policy and loaded like the base (its dtype, quantization and trust_remote_code); it must
    share the base model's tokenizer."""


class ReferencedRequest(RequestBase):
    """What DPO and KTO share: a frozen reference model, the base itself unless `ref_model` names one."""

    ref_model: ReferenceModelSpec | None = Field(
        None,
        description=(
            "The reference model; absent: the base itself (with LoRA, the base with the adapter switched off)."
        ),
    )

    @model_validator(mode="after")
    def _reference_fits(self) -> ReferencedRequest:
        """TRL computes reference log-probs ahead (`precompute_ref_log_probs`) only over a map-style
        dataset, never a stream."""
        config = self.method_config
        if isinstance(config, DPOSpec | KTOSpec) and config.precompute_ref_log_probs and self.dataset.streaming:
            raise ValueError(
                f"{self.method}.precompute_ref_log_probs: a streaming dataset cannot have its reference log-probs "
                "computed ahead; set dataset.streaming false or leave precompute_ref_log_probs out"
            )
        return self


class SFTRequest(RequestBase):
    """Supervised fine-tuning with `trl.SFTTrainer`. Rows: `messages`, `prompt`+`completion`, or `text`."""

    method: Literal["sft"]
    sft: SFTSpec = SFTSpec()  # shared when left out, as in RequestBase

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (
            frozenset({"messages"}),
            frozenset({"prompt", "completion"}),
            frozenset({self.sft.dataset_text_field or "text"}),
        )


class DPORequest(ReferencedRequest):
    """Direct preference optimisation with `trl.DPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    method: Literal["dpo"]
    dpo: DPOSpec = DPOSpec()  # shared when left out, as in RequestBase

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class KTORequest(ReferencedRequest):
    """Kahneman-Tversky optimisation with `trl.KTOTrainer`. Rows: `prompt`, `completion`, `label` (bool)."""

    method: Literal["kto"]
    kto: KTOSpec = KTOSpec()  # shared when left out, as in RequestBase

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt", "completion", "label"}),)


class RewardRequest(RequestBase):
    """Reward modelling with `trl.RewardTrainer` (sequence classification head). Rows: `chosen`, `rejected`."""

    method: Literal["reward"]
    reward: RewardSpec = RewardSpec()  # shared when left out, as in RequestBase

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class GRPORequest(RequestBase):
    """Group relative policy optimisation with `trl.GRPOTrainer`. Rows: `prompt` (plus reward columns)."""

    method: Literal["grpo"]
    grpo: GRPOSpec = GRPOSpec()  # shared when left out, as in RequestBase
    rewards: OnlineRewards

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)


class RLOORequest(RequestBase):
    """REINFORCE leave-one-out with `trl.RLOOTrainer`. Rows: `prompt` (plus reward columns)."""

    method: Literal["rloo"]
    rloo: RLOOSpec = RLOOSpec()  # shared when left out, as in RequestBase
    rewards: OnlineRewards

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)


class DistillationRequest(RequestBase):
    """On-policy distillation with `trl.DistillationTrainer`. Rows: `prompt`; the teacher is `teacher_model`."""

    method: Literal["distillation"]
    distillation: DistillationSpec = DistillationSpec()  # shared when left out, as in RequestBase
    teacher_model: TeacherModelSpec

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)


class ORPORequest(RequestBase):
    """Experimental: ORPO with `trl.experimental.orpo.ORPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    method: Literal["orpo"]
    orpo: ORPOSpec = ORPOSpec()  # shared when left out, as in RequestBase

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class CPORequest(RequestBase):
    """Experimental: CPO with `trl.experimental.cpo.CPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    method: Literal["cpo"]
    cpo: CPOSpec = CPOSpec()  # shared when left out, as in RequestBase

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"chosen", "rejected"}),)


class GKDRequest(RequestBase):
    """Experimental: GKD with `trl.experimental.gkd.GKDTrainer`. Rows: `messages`; the teacher is `teacher_model`."""

    method: Literal["gkd"]
    gkd: GKDSpec = GKDSpec()  # shared when left out, as in RequestBase
    teacher_model: TeacherModelSpec

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"messages"}),)


class OnlineDPORequest(RequestBase):
    """Experimental: online DPO with `trl.experimental.online_dpo.OnlineDPOTrainer`. Rows: `prompt` (plus
    reward columns); each pair of the policy's answers is judged by `rewards`."""

    method: Literal["online_dpo"]
    online_dpo: OnlineDPOSpec = OnlineDPOSpec()  # shared when left out, as in RequestBase
    rewards: OnlineRewards

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)


class PPORequest(RequestBase):
    """Experimental: PPO with `trl.experimental.ppo.PPOTrainer` (trl 1.10 to 1.12 only). Rows: `prompt`.
    The reward model is a sequence classifier by repo id, e.g. the output of a `reward` request."""

    method: Literal["ppo"]
    ppo: PPOSpec = PPOSpec()  # shared when left out, as in RequestBase
    reward_model: RewardModelSpec
    kl_early_stop: KLEarlyStopSpec | None = None

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"prompt"}),)
