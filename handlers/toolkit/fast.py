"""The host's speed settings (`JobSpec.fast`, the daemon's choice), in the child: each applied only
where the request leaves the same field unset (the request's own value always wins), and only where
this host can run it. Gradient checkpointing and Liger go into the TRL config (handlers/toolkit/training.py
`trl_config`), the attention into every model's loading (handlers/toolkit/loading.py `model_kwargs`, chosen
once per job by handlers/toolkit/sequence.py `load_base`). What a job ran with is recorded (reporting.py
`applied`, `TrainResult.fast`); a setting this host cannot run is logged as
`job.fast_setting_unavailable` and left off (a flash attention falls back to sdpa).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import torch

from handlers.protocol import JobSpec
from handlers.toolkit.reporting import applied
from schemas.request import ModelSpec

# The child's log line for a host setting it cannot apply (its stdout: the job's log and the daemon's).
UNAVAILABLE = "job.fast_setting_unavailable"
# The attention implementations that run anywhere torch does; the others are flash attention, CUDA only.
PORTABLE_ATTENTION = frozenset({"eager", "sdpa"})
# The package each flash attention of transformers' own needs; `kernels` (the Hub's kernels) serves each too.
FLASH_PACKAGES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
# The TRL config's fields for gradient checkpointing: transformers' name since 5.x and its older alias.
CHECKPOINTING_FIELDS = ("activation_checkpointing", "gradient_checkpointing")

_attention: str | None = (
    None  # the host's attention for this job's models, where the request names none (`choose_attention`)
)


def log(event: str, **fields: object) -> None:
    """One line of the child's log: a constant event name, then key=value pairs."""
    pairs = " ".join(f"{key}={value}" for key, value in fields.items())
    print(f"adapterd child {os.getpid()}: {event} {pairs}", flush=True)


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def liger_installed() -> bool:
    """Whether transformers can apply Liger here (liger_kernel installed, at a version it takes)."""
    from transformers.utils import is_liger_kernel_available

    return bool(is_liger_kernel_available())


def attention_unavailable(name: str) -> str | None:
    """Why this host cannot run the attention implementation `name`; None when it can."""
    if name in PORTABLE_ATTENTION:
        return None
    if not torch.cuda.is_available():
        return "flash attention needs a CUDA GPU and this host has none"
    packages = [FLASH_PACKAGES[name]] if name in FLASH_PACKAGES else []
    if any(installed(package) for package in [*packages, "kernels"]):
        return None
    return f"neither {' nor '.join([*packages, 'kernels'])} is installed"


def training_arguments(job: JobSpec, requested: dict[str, Any], fields: set[str]) -> dict[str, Any]:
    """The TRL config arguments of the host's settings, each where `requested` (the request's own
    arguments) leaves it unset; `fields`: the config class's field names."""
    host, arguments = job.fast, {}
    if host.gradient_checkpointing is not None and not set(CHECKPOINTING_FIELDS) & set(requested):
        # By its current name where the config has it: TRL's default is set on the old
        # alias, which the new name overrides.
        name = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
        arguments[name] = host.gradient_checkpointing
        applied("gradient_checkpointing", host.gradient_checkpointing)
    if host.use_liger_kernel is not None and "use_liger_kernel" not in requested:
        if host.use_liger_kernel and not liger_installed():
            log(
                UNAVAILABLE,
                setting="use_liger_kernel",
                wanted=True,
                using=False,
                reason="liger_kernel is not installed",
            )
        else:
            arguments["use_liger_kernel"] = host.use_liger_kernel
            applied("use_liger_kernel", host.use_liger_kernel)
    return arguments


def choose_attention(spec: ModelSpec, job: JobSpec) -> None:
    """At each job's `load_model`, before any model loads: the host's attention for this job's models
    where the request's `model.attn_implementation` is unset (its reference and teacher load with the
    base's options), sdpa in place of a flash attention this host cannot run."""
    global _attention
    _attention = None
    wanted = job.fast.attn_implementation
    if wanted is None or spec.attn_implementation is not None:
        return
    reason = attention_unavailable(wanted)
    if reason is not None:
        log(UNAVAILABLE, setting="attn_implementation", wanted=wanted, using="sdpa", reason=reason)
    _attention = wanted if reason is None else "sdpa"
    applied("attn_implementation", _attention)


def attention(spec: ModelSpec) -> str | None:
    """The attention a model loads with: the request's own, else the host's for this job, else None
    (transformers' default)."""
    return spec.attn_implementation if spec.attn_implementation is not None else _attention
