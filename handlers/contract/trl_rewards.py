"""The request's reward functions against the installed TRL's `trl.rewards`: each public function
there is a reward a request can name (schemas/rewards.py's TRL_REWARDS), with TRL's parameters and
defaults. tests/schemas/test_reward_drift.py fails on what this names.
"""

from __future__ import annotations

import inspect
import types
from typing import Any

from pydantic_core import PydanticUndefined

from schemas.rewards import ADAPTERD_FIELDS, TRL_REWARDS

# What TRL passes a reward function when it scores (GRPOTrainer._calculate_rewards), and the keyword
# arguments it takes for that: not parameters a request sets.
SCORING_ARGUMENTS = frozenset(
    {"completions", "prompts", "completion_ids", "solution", "log_extra", "log_metric", "trainer_state", "kwargs"}
)


def trl_functions(module: Any) -> dict[str, Any]:
    """The reward functions `module` (trl.rewards) exports: its `__all__`, less its submodules."""
    # the module's names, read from the install: what this TRL ships is known only here
    return {
        name: getattr(module, name)
        for name in module.__all__
        if not isinstance(getattr(module, name), types.ModuleType)
    }


def parameters(function: Any) -> dict[str, Any]:
    """A reward's parameters a request sets, with TRL's defaults (PydanticUndefined where required):
    a factory's (get_*) arguments, or a function's keyword arguments besides the scoring ones."""
    found = {}
    for name, parameter in inspect.signature(function).parameters.items():
        if name in SCORING_ARGUMENTS or parameter.kind in (parameter.VAR_KEYWORD, parameter.VAR_POSITIONAL):
            continue
        found[name] = PydanticUndefined if parameter.default is inspect.Parameter.empty else parameter.default
    return found


def reward_drift(module: Any) -> list[str]:
    """What differs between `module`'s reward functions and TRL_REWARDS, one line each."""
    functions = trl_functions(module)
    found = [
        f"trl.rewards.{name}: a reward TRL ships that a request cannot name: add it to "
        "TRL_REWARDS in schemas/rewards.py"
        for name in sorted(set(functions) - set(TRL_REWARDS))
    ]
    found += [
        f"trl.rewards.{name}: gone from TRL: remove {TRL_REWARDS[name].__name__} from schemas/rewards.py"
        for name in sorted(set(TRL_REWARDS) - set(functions))
    ]
    for name in sorted(set(functions) & set(TRL_REWARDS)):
        model = TRL_REWARDS[name]
        ours = {field: info.default for field, info in model.model_fields.items() if field not in ADAPTERD_FIELDS}
        theirs = parameters(functions[name])
        for field in sorted(set(theirs) | set(ours)):
            if field not in ours:
                found.append(f"trl.rewards.{name}({field}): a parameter {model.__name__} lacks")
            elif field not in theirs:
                found.append(f"{model.__name__}.{field}: not a parameter of trl.rewards.{name}")
            elif ours[field] != theirs[field]:
                found.append(f"{model.__name__}.{field}: default {ours[field]!r}, TRL's {theirs[field]!r}")
    return found
