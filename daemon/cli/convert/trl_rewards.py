"""The reward keys of a GRPO or RLOO `trl` CLI config: trl's own reward functions by the names its
script takes, open-r1's by the names its grpo.py takes (open_r1_rewards.py), a reward model by id,
and reward_weights. Each function named gets a line of the ledger: what it was carried as, or why
not; a reward not carried fails the conversion (training without it would be another training)."""

from __future__ import annotations

from typing import Any

from daemon.cli.convert.ledger import Dropped, Ledger, Noted
from daemon.cli.convert.open_r1_rewards import OPEN_R1_DEFAULT, OPEN_R1_PARAMETERS, OpenR1Reward, open_r1_reward

REWARD_DEFAULTS: dict[str, Any] = {"reward_model_name_or_path": None, "reward_funcs": None}
REWARD_METHODS = ("grpo", "rloo")
# trl's script's reward_funcs registry (trl/scripts/grpo.py and rloo.py, trl 1.16), as the request names each.
TRL_SCRIPT_REWARDS: dict[str, dict[str, Any]] = {
    "accuracy_reward": {"name": "accuracy"},
    "reasoning_accuracy_reward": {"name": "reasoning_accuracy"},
    "think_format_reward": {"name": "think_format"},
    "get_soft_overlong_punishment": {
        "name": "soft_overlong_punishment",
        "max_completion_len": 1280,
        "soft_punish_cache": 256,
    },
}
SHIPPED = (
    "accuracy, reasoning_accuracy, cosine_scaled, repetition_penalty, soft_overlong_punishment, think_format, "
    "tag_count, exact_match, regex_match, length_penalty"
)
# Keys that mark a file as open-r1's recipe (its GRPOScriptArguments), whose script defaults reward_funcs.
OPEN_R1_KEYS = frozenset({"dataset_prompt_column", "system_prompt", *OPEN_R1_PARAMETERS})


def _trl_script(name: str) -> OpenR1Reward | None:
    function = TRL_SCRIPT_REWARDS.get(name.removeprefix("trl.rewards."))
    if function is None:
        return None
    return OpenR1Reward(
        dict(function),
        f"carried as {function['name']}"
        + (
            f" (trl's script builds it with max_completion_len {function['max_completion_len']}, soft_punish_cache "
            f"{function['soft_punish_cache']})"
            if "max_completion_len" in function
            else ""
        ),
    )


def carry_rewards(keys: Ledger) -> None:
    """GRPO's and RLOO's reward arguments: the functions by name, a reward model by id, and
    reward_weights (model first, then the functions, as trl's script orders them)."""
    weights = keys.get("reward_weights")
    weights = list(weights) if isinstance(weights, list) else None
    slots: list[dict[str, Any] | None] = []
    rewards: dict[str, Any] = {}
    if keys.get("reward_model_name_or_path"):
        rewards["model"] = {"id": keys.config["reward_model_name_or_path"]}
        slots.append(rewards["model"])
    named = keys.get("reward_funcs")
    open_r1 = named is None and keys.request.get("method") == "grpo" and bool(OPEN_R1_KEYS & set(keys.config))
    names = list(OPEN_R1_DEFAULT) if open_r1 else ([named] if isinstance(named, str) else list(named or []))
    parameters = {key: keys.config.get(key, default) for key, default in OPEN_R1_PARAMETERS.items()}
    read_by: dict[str, str] = {}  # an open-r1 parameter → the reward reading it
    for index, name in enumerate(names):
        where = "reward_funcs (not in the file: open-r1's grpo.py default)" if open_r1 else f"reward_funcs.{index}"
        found = _trl_script(str(name)) or open_r1_reward(str(name), parameters)
        if found is None:
            why = f"{name} is not a reward adapterd ships ({SHIPPED}); a request never names code to import"
            keys.dropped.append(Dropped(where, why))
            keys.error("rewards", f"{where}: {why}")
            slots.append(None)
            continue
        keys.noted.append(
            Noted(
                where if not open_r1 else f"reward_funcs.{index}",
                f"{name}: {found.said}" + (" (open-r1's default, the file names no reward_funcs)" if open_r1 else ""),
            )
        )
        for key in found.reads:
            read_by.setdefault(key, str(name))
        if found.function is None:
            keys.error("rewards", f"{where}: {name}: {found.said}")
            slots.append(None)
            continue
        rewards.setdefault("functions", []).append(found.function)
        slots.append(found.function)
        for key in found.reads:
            if key in keys.config:
                keys.origin[f"rewards.functions.{len(rewards['functions']) - 1}.{key}"] = key
    _open_r1_parameters(keys, read_by, rewards)
    if weights is not None:
        if len(weights) != len(slots):
            keys.error("rewards", f"reward_weights: {len(weights)} weights for {len(slots)} rewards")
        for slot, weight in zip(slots, weights, strict=False):
            if slot is not None:
                slot["weight"] = weight
                where = (
                    "model"
                    if slot is rewards.get("model")
                    else f"functions.{next(i for i, f in enumerate(rewards['functions']) if f is slot)}"
                )
                keys.origin[f"rewards.{where}.weight"] = "reward_weights"
    if rewards:
        keys.request["rewards"] = rewards
        keys.origin["rewards"] = "reward_funcs"
    elif not names and not keys.config.get("reward_model_name_or_path"):
        message = (
            "the file names no reward (reward_funcs, reward_model_name_or_path): name one "
            f"({SHIPPED}), or a reward model"
        )
        if keys.request.get("method") == "grpo":
            message += (
                f". open-r1's script would use its default, {', '.join(OPEN_R1_DEFAULT)} "
                f"(reward_funcs: [{', '.join(OPEN_R1_DEFAULT)}] converts them)"
            )
        keys.error("rewards", message)


def _open_r1_parameters(keys: Ledger, read_by: dict[str, str], rewards: dict[str, Any]) -> None:
    """open-r1's reward parameters in the file: carried with their reward, or said to be read by one
    not carried, or by none the file names."""
    carried = {path.rsplit(".", 1)[1] for path in keys.origin if path.startswith("rewards.functions.")}
    for key in OPEN_R1_PARAMETERS:
        if key not in keys.config or key in carried:
            keys.taken.add(key)
            continue
        reader = read_by.get(key)
        keys.drop(
            key,
            f"read by open-r1's {reader} reward, which is not carried"
            if reader
            else "read only by an open-r1 reward the file does not name",
        )
