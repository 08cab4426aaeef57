"""The operator's bounds on the work a request may ask for: one table, field → the setting that caps it.

TRL accepts any size (a batch of 1e9, 100,000 dataloader workers, a million generations per
prompt), and each of those exhausts the host: its memory, its processes, its GPU for months. A
request's field named here, in `training` or in its method's block, above the operator's bound is
rejected at intake (reason `policy`), naming the field and the setting. The defaults are safe for
one GPU host and stated in docs/guarantees.md; an operator raises a bound in adapterd.toml.
"""

from __future__ import annotations

from typing import Any

from daemon.settings import Settings
from schemas import FieldError, RequestBase
from schemas.evaluation import RewardsSuite, TaskSuite

# Field (as TRL names it, in `training` or the method's block) → the setting that bounds it.
BOUNDS: dict[str, str] = {
    "per_device_train_batch_size": "max_batch_size",
    "per_device_eval_batch_size": "max_batch_size",
    "precompute_ref_batch_size": "max_batch_size",
    "generation_batch_size": "max_batch_size",
    "gradient_accumulation_steps": "max_gradient_accumulation_steps",
    "eval_accumulation_steps": "max_gradient_accumulation_steps",
    "dataloader_num_workers": "max_processes",
    "dataset_num_proc": "max_processes",
    "max_steps": "max_steps",
    "num_train_epochs": "max_epochs",
    "num_ppo_epochs": "max_epochs",
    "num_iterations": "max_epochs",
    "num_generations": "max_generations",
    "num_generations_eval": "max_generations",
    "num_sample_generations": "max_generations",
    "max_completion_length": "max_new_tokens",
    "max_new_tokens": "max_new_tokens",  # gkd's on-policy answers
    "max_length": "max_sequence_length",
}
# Keys inside `generation_kwargs` (passed to transformers' generate) → the setting that bounds them.
GENERATION_BOUNDS: dict[str, str] = {
    "max_new_tokens": "max_new_tokens",
    "max_length": "max_sequence_length",
    "num_return_sequences": "max_generations",
    "num_beams": "max_generations",
}


def bound_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    """Each field of the request above the operator's bound for it."""
    errors: list[FieldError] = []
    method = request.method
    for block_name, block in (("training", request.training), (method, request.method_config)):
        # BOUNDS names fields of TRL's config classes, each class having some of them
        for field, setting in BOUNDS.items():
            errors += _over(f"{block_name}.{field}", getattr(block, field, None), setting, settings)
        generation = getattr(block, "generation_kwargs", None)  # the online methods' configs have it
        if isinstance(generation, dict):
            for key, setting in GENERATION_BOUNDS.items():
                errors += _over(f"{block_name}.generation_kwargs.{key}", generation.get(key), setting, settings)
    for index, suite in enumerate(request.evaluation.suites if request.evaluation is not None else []):
        errors += _over(
            f"evaluation.suites.{index}.max_new_tokens",
            suite.max_new_tokens if isinstance(suite, RewardsSuite | TaskSuite) else None,
            "max_new_tokens",
            settings,
        )
    return errors


def _over(path: str, value: Any, setting: str, settings: Settings) -> list[FieldError]:
    bound = getattr(settings, setting)  # the setting named in BOUNDS or GENERATION_BOUNDS
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= bound:
        return []
    return [FieldError(path=path, message=f"{value:g}; this host allows at most {bound:g} ({setting})")]
