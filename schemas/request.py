"""Version 1 of a training request, as published to `adapterd.requests`.

Field names follow TRL's and PEFT's own config names wherever one exists, so what users know from
TRL carries over. A field left out means "TRL's default": the daemon passes on only what was set.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, JsonValue, model_validator

from schemas.common import REQUEST_ID_PATTERN, SCHEMA_VERSION, Frozen

MAX_INLINE_ROWS = 10_000

# A Hub repo id ("name" or "namespace/name"), or an absolute local path that the operator allows.
MODEL_ID_PATTERN = r"^(/\S+|[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?)$"
REPO_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"


class ModelSpec(Frozen):
    """The base model to train."""

    id: str = Field(pattern=MODEL_ID_PATTERN, description="Hub repo id, or an absolute local path the operator allows.")
    revision: str | None = Field(None, description="Branch, tag or commit sha on the Hub; the default branch when absent.")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    trust_remote_code: bool = Field(False, description="Refused unless the operator's policy allows it.")
    quantization: Literal["none", "4bit", "8bit"] = Field("none", description="4bit/8bit load the base through bitsandbytes (QLoRA); needs CUDA.")


class DatasetSpec(Frozen):
    """Where the training rows come from: exactly one of `id` (a Hub dataset) or `rows` (inline)."""

    id: str | None = Field(None, pattern=REPO_ID_PATTERN, description="Hub dataset repo id.")
    config: str | None = None
    split: str = "train"
    revision: str | None = None
    data_files: str | list[str] | dict[str, str | list[str]] | None = None
    rows: list[dict[str, JsonValue]] | None = Field(None, min_length=1, max_length=MAX_INLINE_ROWS, description="Inline rows, at most 10,000.")
    max_samples: int | None = Field(None, ge=1, description="Use at most this many rows of the training split.")
    eval_split: str | None = Field(None, description="A split of the same dataset to evaluate on.")
    columns: dict[str, str] = Field(default_factory=dict, description="Renames dataset columns onto the names the method expects: {dataset_column: expected_column}.")

    @model_validator(mode="after")
    def _one_source(self) -> DatasetSpec:
        if (self.id is None) == (self.rows is None):
            raise ValueError("give exactly one of 'id' (a Hub dataset) or 'rows' (inline rows)")
        return self


class LoraSpec(Frozen):
    """PEFT LoRA settings (`peft.LoraConfig` names). `peft: null` in a request means a full fine-tune."""

    r: int = Field(16, ge=1, le=1024)
    lora_alpha: int = Field(32, ge=1)
    lora_dropout: float = Field(0.05, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"
    use_rslora: bool = False
    use_dora: bool = False


class TrainingSpec(Frozen):
    """The trainer arguments common to every method (`transformers.TrainingArguments` names)."""

    learning_rate: float | None = Field(None, gt=0)
    num_train_epochs: float | None = Field(None, gt=0)
    max_steps: int | None = Field(None, ge=1)
    per_device_train_batch_size: int | None = Field(None, ge=1)
    per_device_eval_batch_size: int | None = Field(None, ge=1)
    gradient_accumulation_steps: int | None = Field(None, ge=1)
    warmup_steps: float | None = Field(None, ge=0, description="Steps, or a fraction of the run when below 1.")
    lr_scheduler_type: Literal["linear", "cosine", "cosine_with_restarts", "polynomial", "constant", "constant_with_warmup"] | None = None
    weight_decay: float | None = Field(None, ge=0)
    max_grad_norm: float | None = Field(None, gt=0)
    logging_steps: int | None = Field(None, ge=1)
    save_steps: int | None = Field(None, ge=1)
    eval_strategy: Literal["no", "steps", "epoch"] | None = None
    eval_steps: int | None = Field(None, ge=1)
    seed: int | None = None
    gradient_checkpointing: bool | None = None
    bf16: bool | None = None
    report_to: list[Literal["trackio", "wandb", "mlflow", "tensorboard"]] | None = Field(
        None, description="TRL reporting integrations for this job; each must be in the host's allowed_report_to.",
    )


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


class ExactMatchReward(Frozen):
    """1.0 when the completion, stripped, equals the row's reference column; else 0.0."""

    name: Literal["exact_match"]
    weight: float = 1.0
    column: str = "answer"


class RegexReward(Frozen):
    """1.0 when the completion matches `pattern` (Python `re.search`); else 0.0."""

    name: Literal["regex_match"]
    weight: float = 1.0
    pattern: str = Field(min_length=1, max_length=1000)

    @model_validator(mode="after")
    def _compiles(self) -> RegexReward:
        import re

        try:
            re.compile(self.pattern)
        except re.error as exc:
            raise ValueError(f"pattern does not compile: {exc}") from exc
        return self


class LengthPenaltyReward(Frozen):
    """-|len(completion) - target_chars| / target_chars: 0.0 at the target length, lower away from it."""

    name: Literal["length_penalty"]
    weight: float = 1.0
    target_chars: int = Field(ge=1)


class ThinkFormatReward(Frozen):
    """TRL's `think_format_reward`: 1.0 when the completion has a `<think>...</think>` block first."""

    name: Literal["think_format"]
    weight: float = 1.0


RewardFunction = Annotated[
    ExactMatchReward | RegexReward | LengthPenaltyReward | ThinkFormatReward,
    Field(discriminator="name"),
]


class RewardModelSpec(Frozen):
    """A sequence-classification reward model on the Hub, e.g. the output of a `reward` request."""

    id: str = Field(pattern=MODEL_ID_PATTERN)
    revision: str | None = None
    weight: float = 1.0


class OnlineRewards(Frozen):
    """What scores an online method's completions: shipped functions by name, and/or a reward model.
    A request can never name code to import."""

    functions: list[RewardFunction] = Field(default_factory=list, max_length=16)
    model: RewardModelSpec | None = None

    @model_validator(mode="after")
    def _at_least_one(self) -> OnlineRewards:
        if not self.functions and self.model is None:
            raise ValueError("give at least one reward function or a reward model")
        return self


class OutputSpec(Frozen):
    """Where the trained adapter goes."""

    repo_id: str = Field(pattern=REPO_ID_PATTERN, description="Hub model repo 'namespace/name'; created if missing.")
    private: bool = Field(True, description="Visibility of a repo adapterd creates; an existing repo keeps its own.")
    revision: str = Field("main", description="Branch to commit to; created from the default branch if missing.")
    push: Literal["adapter", "merged"] = Field("adapter", description="'merged' merges the adapter into the base before pushing.")


class Resources(Frozen):
    gpus: int = Field(1, ge=1, le=64, description="GPUs for the job; more than one runs data-parallel (torchrun) on one host.")


class RequestBase(Frozen):
    """The fields every method shares."""

    # TRL's experimental layer (`trl.experimental...`): its API may change between TRL releases.
    experimental: ClassVar[bool] = False
    # The column sets the method accepts, any one of which the dataset must have (after `columns`).
    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = ()

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str = Field(pattern=REQUEST_ID_PATTERN, description="Idempotency key; also the Kafka key.")
    model: ModelSpec
    dataset: DatasetSpec
    peft: LoraSpec | None = Field(default_factory=LoraSpec, description="LoRA settings; null for a full fine-tune.")
    training: TrainingSpec = Field(default_factory=TrainingSpec)
    output: OutputSpec
    resources: Resources = Field(default_factory=Resources)
    timeout_s: int | None = Field(None, ge=1, description="Wall-clock limit of the job; capped by the operator's maximum.")
    metadata: dict[str, str] = Field(default_factory=dict, max_length=64, description="Free key-value pairs, echoed in every event.")

    @model_validator(mode="after")
    def _inline_rows_fit_the_method(self) -> RequestBase:
        if self.dataset.rows is not None:
            common = set.intersection(*(set(row) for row in self.dataset.rows))
            problem = self.dataset_problem([self.dataset.columns.get(c, c) for c in common])
            if problem:
                raise ValueError(problem)
        if self.model.quantization != "none" and self.peft is None:
            raise ValueError(f"model.quantization {self.model.quantization} (QLoRA) trains a LoRA adapter: set 'peft'")
        return self

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return self.dataset_formats

    def dataset_problem(self, columns: list[str]) -> str | None:
        """Why a dataset with these columns cannot feed this method, or None when it can."""
        formats = self.accepted_formats()
        if any(form <= set(columns) for form in formats):
            return None
        options = " or ".join(" and ".join(f"'{c}'" for c in sorted(form)) for form in formats)
        return f"dataset.columns: method {getattr(self, 'method')} needs {options}; found {sorted(columns)}"

    def set_fields(self, block: str) -> dict[str, Any]:
        """The fields of one block that the request set, to pass on to TRL as keyword arguments."""
        return getattr(self, block).model_dump(exclude_none=True)


class SFTRequest(RequestBase):
    """Supervised fine-tuning with `trl.SFTTrainer`. Rows: `messages`, `prompt`+`completion`, or `text`."""

    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"messages"}), frozenset({"prompt", "completion"}), frozenset({"text"}))
    method: Literal["sft"]
    sft: SFTSpec = Field(default_factory=SFTSpec)

    def accepted_formats(self) -> tuple[frozenset[str], ...]:
        return (frozenset({"messages"}), frozenset({"prompt", "completion"}), frozenset({self.sft.dataset_text_field or "text"}))


class DPORequest(RequestBase):
    """Direct preference optimisation with `trl.DPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"chosen", "rejected"}),)
    method: Literal["dpo"]
    dpo: DPOSpec = Field(default_factory=DPOSpec)


class KTORequest(RequestBase):
    """Kahneman-Tversky optimisation with `trl.KTOTrainer`. Rows: `prompt`, `completion`, `label` (bool)."""

    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"prompt", "completion", "label"}),)
    method: Literal["kto"]
    kto: KTOSpec = Field(default_factory=KTOSpec)


class RewardRequest(RequestBase):
    """Reward modelling with `trl.RewardTrainer` (sequence classification head). Rows: `chosen`, `rejected`."""

    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"chosen", "rejected"}),)
    method: Literal["reward"]
    reward: RewardSpec = Field(default_factory=RewardSpec)


class GRPORequest(RequestBase):
    """Group relative policy optimisation with `trl.GRPOTrainer`. Rows: `prompt` (plus reward columns)."""

    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"prompt"}),)
    method: Literal["grpo"]
    grpo: GRPOSpec = Field(default_factory=GRPOSpec)
    rewards: OnlineRewards


class RLOORequest(RequestBase):
    """REINFORCE leave-one-out with `trl.RLOOTrainer`. Rows: `prompt` (plus reward columns)."""

    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"prompt"}),)
    method: Literal["rloo"]
    rloo: RLOOSpec = Field(default_factory=RLOOSpec)
    rewards: OnlineRewards


class ORPORequest(RequestBase):
    """Experimental: ORPO with `trl.experimental.orpo.ORPOTrainer`. Rows: `prompt`, `chosen`, `rejected`."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra={"x-adapterd-experimental": True})
    experimental: ClassVar[bool] = True
    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"chosen", "rejected"}),)
    method: Literal["orpo"]
    orpo: ORPOSpec = Field(default_factory=ORPOSpec)


class PPORequest(RequestBase):
    """Experimental: PPO with `trl.experimental.ppo.PPOTrainer` (trl 1.10 to 1.12 only). Rows: `prompt`.
    The reward model is a sequence classifier by repo id, e.g. the output of a `reward` request."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra={"x-adapterd-experimental": True})
    experimental: ClassVar[bool] = True
    dataset_formats: ClassVar[tuple[frozenset[str], ...]] = (frozenset({"prompt"}),)
    method: Literal["ppo"]
    ppo: PPOSpec = Field(default_factory=PPOSpec)
    reward_model: RewardModelSpec
    kl_early_stop: KLEarlyStopSpec | None = None


# The request models by method name. A new method adds one model here and one handler module.
REQUEST_MODELS: dict[str, type[RequestBase]] = {
    "sft": SFTRequest,
    "dpo": DPORequest,
    "kto": KTORequest,
    "reward": RewardRequest,
    "grpo": GRPORequest,
    "rloo": RLOORequest,
    "orpo": ORPORequest,
    "ppo": PPORequest,
}

TrainingRequest = Annotated[
    SFTRequest | DPORequest | KTORequest | RewardRequest | GRPORequest | RLOORequest | ORPORequest | PPORequest,
    Field(discriminator="method"),
]
