"""The reviewed rules the request's TRL blocks are generated under: what a request may not set and
why, renamed fields kept under their old names, and the few facts TRL's dataclasses do not state
(allowed values written only in help text, bounds, adapterd's LoRA defaults).

Everything else about a field (its name, type, default, choices and help text) is read from the
locked TRL, transformers and PEFT by `python -m handlers.contract.generate_contract`, which writes
schemas/trl_contract.json, schemas/trl_fields.py and docs/requests.md. A test fails when an entry
here no longer names a real field.

A refusal is one of three kinds:
- `daemon`: the daemon sets it for every job (where checkpoints go, the push, the launch);
- `host`: a path or an address on the host, which a request never reaches; where users need the
  capability there is a safe form, named in `instead`;
- `policy`: a loading argument that could get round the operator's policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, TypeVar

RefusalKind = Literal["daemon", "host", "policy"]

# The blocks every method's request has; the others are one method's own (a TRL config's fields).
SHARED_BLOCKS = ("training", "peft", "model")

# The request's blocks and the dataclass each is generated from ("section" in trl_contract.json).
BLOCK_SOURCES: dict[str, str] = {
    "training": "transformers.TrainingArguments",
    "peft": "peft.LoraConfig",
    "model": "trl.ModelConfig",
    "sft": "trl.SFTConfig",
    "dpo": "trl.DPOConfig",
    "kto": "trl.KTOConfig",
    "reward": "trl.RewardConfig",
    "grpo": "trl.GRPOConfig",
    "rloo": "trl.RLOOConfig",
    "distillation": "trl.DistillationConfig",
    "orpo": "trl.experimental.orpo.ORPOConfig",
    "cpo": "trl.experimental.cpo.CPOConfig",
    "gkd": "trl.experimental.gkd.GKDConfig",
    "online_dpo": "trl.experimental.online_dpo.OnlineDPOConfig",
    "ppo": "trl.experimental.ppo.PPOConfig",
}


@dataclass(frozen=True)
class Refusal:
    kind: RefusalKind
    reason: str
    instead: str = ""  # the safe form, where there is one

    def message(self, field: str, source: str | None = None) -> str:
        """What a request that sets the field is told: "output_dir: set by the daemon: ...", or, given
        the dataclass it comes from (BLOCK_SOURCES), "output_dir: transformers.TrainingArguments.output_dir
        is refused (set by the daemon): ..."."""
        kinds = {
            "daemon": "set by the daemon",
            "host": "a path or address on the host",
            "policy": "would get round the host's policy",
        }
        why = f"{source}.{field} is refused ({kinds[self.kind]})" if source else kinds[self.kind]
        return f"{field}: {why}: {self.reason}" + (f"; use {self.instead}" if self.instead else "")


_HUB = Refusal("daemon", "the daemon pushes the result to `output.repo_id` once training succeeds", "output.*")
# Sharding is asked for in the request's resources (`resources.shard`), which the child applies itself
# (handlers/toolkit/distributed/fsdp.py): the trainer's own FSDP arguments shard only on GPUs, and silently not on CPU.
_LAUNCH = Refusal(
    "daemon",
    "the daemon launches the job's processes (torchrun over `resources.gpus`) and shards "
    "them as `resources.shard` asks",
    "resources.gpus and resources.shard",
)
_CODE = Refusal("policy", "remote code runs only where the operator's policy allows it", "model.trust_remote_code")
_INIT = Refusal(
    "policy",
    "loading keyword arguments could set a revision, token, device map or remote code round the policy",
    "model.* (dtype, attn_implementation, quantization)",
)
_VLLM_SERVER = Refusal(
    "host",
    "a vLLM server is an address; server mode goes to the server the operator configured",
    "vllm_mode: server on a host with ADAPTERD_VLLM_SERVER_BASE_URL",
)
_TEMPLATE_PATH = Refusal(
    "host", "a chat template is read from a host path or a repo", "model.chat_template (the Jinja template inline)"
)
_TRACKIO = Refusal(
    "host",
    "a Trackio Space or bucket on the Hub is created under the host's credentials, outside `allowed_output_namespaces`",
    "training.report_to with trackio, where the host allows it (it logs to the host's trackio_dir)",
)

# Distillation's and GKD's teacher is the request's `teacher_model`, under the host's model policy.
_TEACHER = {
    "teacher_model_name_or_path": Refusal(
        "daemon", "the teacher is named in the request and checked by policy", "teacher_model.id"
    ),
    "teacher_model_revision": Refusal("daemon", "the teacher's revision is the request's", "teacher_model.revision"),
    "teacher_model_init_kwargs": _INIT,
}

# Block → field → why a request may not set it. "*" applies to every TRL config block (the method blocks).
REFUSED: dict[str, dict[str, Refusal]] = {
    "training": {
        "output_dir": Refusal("daemon", "checkpoints go to the job's folder, where a retry resumes from them"),
        "resume_from_checkpoint": Refusal("daemon", "a retry resumes from the job's own last checkpoint"),
        "save_strategy": Refusal(
            "daemon", "the daemon saves every `save_steps` so a retry or a stop resumes", "training.save_steps"
        ),
        "save_total_limit": Refusal("daemon", "the daemon keeps the last two checkpoints of a job"),
        "save_only_model": Refusal(
            "daemon", "a checkpoint without optimizer state cannot be resumed after a crash or a stop"
        ),
        "use_cpu": Refusal(
            "daemon", "the daemon trains on the GPU the job was given, on the CPU only on a host without one"
        ),
        "disable_tqdm": Refusal("daemon", "progress goes out as `progress` events, not to a terminal"),
        "local_rank": _LAUNCH,
        "parallelism_config": _LAUNCH,
        "deepspeed": Refusal(
            "host",
            "a DeepSpeed config is a host file, and the daemon launches the processes; DeepSpeed is not offered",
            "resources.shard: fsdp",
        ),
        "fsdp": _LAUNCH,
        "fsdp_config": Refusal(
            "host", "an FSDP config is a host file, and the daemon launches the processes", "resources.shard: fsdp"
        ),
        "push_to_hub": _HUB,
        "hub_model_id": _HUB,
        "hub_strategy": _HUB,
        "hub_token": Refusal("daemon", "credentials never go in a request; the daemon uses the host's own"),
        "hub_private_repo": _HUB,
        "hub_always_push": _HUB,
        "hub_revision": _HUB,
        "trackio_space_id": _TRACKIO,
        "trackio_bucket_id": _TRACKIO,
        "trackio_static_space_id": _TRACKIO,
    },
    "peft": {
        "task_type": Refusal("daemon", "the method decides it (CAUSAL_LM, or SEQ_CLS for reward)"),
        "peft_type": Refusal("daemon", "the `peft` block is a LoRA adapter"),
        "auto_mapping": Refusal("daemon", "PEFT fills it in when it saves"),
        "peft_version": Refusal("daemon", "PEFT fills it in when it saves"),
        "base_model_name_or_path": Refusal("daemon", "the base model is the request's", "model.id"),
        "revision": Refusal("daemon", "the base model's revision is the request's", "model.revision"),
        "inference_mode": Refusal("daemon", "an adapter in training is not in inference mode"),
        "megatron_core": Refusal("host", "it names a module on the host to import"),
    },
    "distillation": _TEACHER,
    "gkd": {
        name: refusal for name, refusal in _TEACHER.items() if name != "teacher_model_revision"
    },  # GKDConfig has no revision field
    "ppo": {
        **{
            name: Refusal("daemon", "PPOTrainer computes it at run time from the batch sizes and the processes")
            for name in (
                "batch_size",
                "local_batch_size",
                "micro_batch_size",
                "mini_batch_size",
                "num_total_batches",
                "world_size",
                "local_mini_batch_size",
                "local_rollout_forward_batch_size",
            )
        },
        "model_adapter_name": Refusal("daemon", "adapterd builds the policy and reference from one LoRA adapter"),
        "ref_adapter_name": Refusal("daemon", "adapterd builds the policy and reference from one LoRA adapter"),
    },
    "*": {
        "reward_weights": Refusal("daemon", "the daemon passes each reward's own weight", "rewards.functions[].weight"),
        "model_init_kwargs": _INIT,
        "trust_remote_code": _CODE,
        "chat_template_path": _TEMPLATE_PATH,
        "vllm_server_base_url": _VLLM_SERVER,
        "vllm_server_host": _VLLM_SERVER,
        "vllm_server_port": _VLLM_SERVER,
        "vllm_group_port": _VLLM_SERVER,
        "reward_model_path": Refusal(
            "daemon", "the reward model is named in the request and checked by policy", "reward_model"
        ),
        "sft_model_path": Refusal("daemon", "the policy model is the request's base model", "model.id"),
    },
}

# trl.ModelConfig fields (the `trl` CLI's model options) that a request says elsewhere, by the path
# it says them at; the rest of ModelConfig is generated into the `model` block.
MODEL_CONFIG_PATHS: dict[str, str] = {
    "model_name_or_path": "model.id",
    "model_revision": "model.revision",
    "dtype": "model.dtype",
    "load_in_4bit": "model.quantization",
    "load_in_8bit": "model.quantization",
    "use_peft": "peft",
    "lora_r": "peft.r",
    "lora_alpha": "peft.lora_alpha",
    "lora_dropout": "peft.lora_dropout",
    "lora_target_modules": "peft.target_modules",
    "lora_target_parameters": "peft.target_parameters",
    "lora_modules_to_save": "peft.modules_to_save",
    "lora_task_type": "peft.task_type",
    "use_rslora": "peft.use_rslora",
    "use_dora": "peft.use_dora",
}

# Block → old name → new name: a field TRL renamed stays accepted under its old name (marked
# deprecated in the JSON Schema) until schema version 2, so producers do not break on an upgrade.
RENAMED: dict[str, dict[str, str]] = {}

# Allowed values that a dataclass states only in its help text, reviewed by hand (the help text is
# in trl_contract.json, so a change to it shows in the drift test). Fields whose help lists its values
# in quotes are read from the help instead: HELP_CHOICES.
_VLLM_CHOICES: dict[str, tuple[str, ...]] = {
    "vllm_mode": ("server", "colocate"),
    "vllm_model_impl": ("vllm", "transformers"),
}
CHOICES: dict[str, dict[str, tuple[str, ...]]] = {
    "grpo": {
        "scale_rewards": ("group", "batch", "none"),
        "importance_sampling_level": ("token", "sequence"),
        "multi_objective_aggregation": ("sum_then_normalize", "normalize_then_sum"),
    },
    # DistillationConfig's help puts these in double quotes and OnlineDPOConfig's in backquoted quotes,
    # neither of which HELP_CHOICES reads.
    "distillation": _VLLM_CHOICES,
    "online_dpo": _VLLM_CHOICES,
}
HELP_CHOICES: dict[str, tuple[str, ...]] = {
    "dpo": ("loss_type", "f_divergence_type"),
    "grpo": ("loss_type", "vllm_mode", "vllm_model_impl"),
    "rloo": ("vllm_mode", "vllm_model_impl"),
}

# Bounds TRL checks late or not at all, so a request fails at intake rather than in the child.
BOUNDS: dict[str, dict[str, dict[str, float]]] = {
    "training": {
        "learning_rate": {"gt": 0},
        "num_train_epochs": {"gt": 0},
        "max_steps": {"ge": 1},
        "per_device_train_batch_size": {"ge": 1},
        "per_device_eval_batch_size": {"ge": 1},
        "gradient_accumulation_steps": {"ge": 1},
        "warmup_steps": {"ge": 0},
        "weight_decay": {"ge": 0},
        "max_grad_norm": {"gt": 0},
        "logging_steps": {"gt": 0},
        "save_steps": {"gt": 0},
        "eval_steps": {"gt": 0},
    },
    "peft": {"r": {"ge": 1, "le": 1024}, "lora_alpha": {"ge": 1}, "lora_dropout": {"ge": 0, "lt": 1}},
    "*": {
        "max_length": {"ge": 1},
        "max_completion_length": {"ge": 1},
        "num_generations": {"ge": 2},
        "num_iterations": {"ge": 1},
    },
    "dpo": {"beta": {"gt": 0}, "label_smoothing": {"ge": 0, "le": 0.5}},
    "kto": {"beta": {"gt": 0}, "desirable_weight": {"gt": 0}, "undesirable_weight": {"gt": 0}},
    "orpo": {"beta": {"gt": 0}},
    "online_dpo": {
        "temperature": {"gt": 0},
        "top_p": {"gt": 0, "le": 1},
        "top_k": {"ge": 0},
        "max_new_tokens": {"ge": 1},
    },
    "gkd": {
        "temperature": {"gt": 0},
        "lmbda": {"ge": 0, "le": 1},
        "beta": {"ge": 0, "le": 1},
        "max_new_tokens": {"ge": 1},
    },
    "cpo": {
        "beta": {"gt": 0},
        "label_smoothing": {"ge": 0, "le": 0.5},
        "cpo_alpha": {"ge": 0},
        "simpo_gamma": {"ge": 0},
    },
    "grpo": {"beta": {"ge": 0}, "temperature": {"gt": 0}, "epsilon": {"gt": 0}},
    "rloo": {"beta": {"ge": 0}, "temperature": {"gt": 0}, "epsilon": {"gt": 0}},
    "distillation": {
        "beta": {"ge": 0, "le": 1},
        "temperature": {"gt": 0},
        "top_p": {"gt": 0, "le": 1},
        "top_k": {"ge": 0},
    },
    "ppo": {
        "kl_coef": {"ge": 0},
        "cliprange": {"gt": 0},
        "vf_coef": {"ge": 0},
        "num_ppo_epochs": {"ge": 1},
        "num_mini_batches": {"ge": 1},
        "response_length": {"ge": 1},
        "total_episodes": {"ge": 1},
        "temperature": {"gt": 0},
    },
}

# Where adapterd's default is not the dataclass's: LoRA follows the `trl` CLI's defaults
# (trl.ModelConfig: r 16, alpha 32, dropout 0.05) and targets every linear layer; a 4bit base is
# double-quantised, as adapterd's QLoRA always was.
DEFAULTS: dict[str, dict[str, object]] = {
    "peft": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05, "target_modules": "all-linear"},
    "model": {"use_bnb_nested_quant": True},
}

# Types narrower than the dataclass's, where the wider form reads a host file or names something
# the host decides: a JSON object instead of "dict or a path to a JSON file".
TYPES: dict[str, dict[str, str]] = {
    "training": {
        "report_to": 'list[Literal["trackio", "wandb", "mlflow", "tensorboard"]]',
        "accelerator_config": "dict[str, Any]",
    },
}
SETTABLE_UNDER_POLICY: dict[str, dict[str, str]] = {
    "training": {"report_to": "each integration must be in the host's allowed_report_to"},
    "grpo": {"log_completions_hub_repo": "the repo's namespace must be in the host's allowed_output_namespaces"},
}


def refusal(block: str, field: str) -> Refusal | None:
    """Why a request may not set `field` in `block`, or None when it may."""
    return rule(REFUSED, block, field)


def refused_names(block: str) -> set[str]:
    """Every name `refusal` refuses in `block`."""
    return set(REFUSED.get(block, {})) | (set() if block in SHARED_BLOCKS else set(REFUSED["*"]))


Entry = TypeVar("Entry")


def rule(table: Mapping[str, Mapping[str, Entry]], block: str, field: str) -> Entry | None:
    """A field's entry in one of the tables above: its block's, else the method blocks' shared "*"."""
    found = table.get(block, {}).get(field)
    if found is None and block not in SHARED_BLOCKS:
        found = table.get("*", {}).get(field)
    return found
