"""The reward keys of a GRPO or RLOO `trl` CLI config: the functions adapterd ships by name, a
reward model by id, and trl's reward_weights."""

from __future__ import annotations

from typing import Any

from daemon.cli.convert.ledger import Dropped, Ledger

REWARD_DEFAULTS: dict[str, Any] = {"reward_model_name_or_path": None, "reward_funcs": None}
REWARD_METHODS = ("grpo", "rloo")
# trl's reward functions that adapterd ships under its own name.
REWARD_FUNCTIONS = {"think_format_reward": "think_format"}
SHIPPED = "exact_match, regex_match, length_penalty, think_format"
# open-r1's reward functions (open_r1/rewards.py) that adapterd has something close to, and how it differs:
# named when a recipe asks for one, never put in the request in its place (that would change the training).
OPEN_R1_CLOSEST = {
    "accuracy": "exact_match against the answer column (open-r1's accuracy checks the answer with math_verify; exact_match compares the text)",
    "format": "think_format (open-r1's format also requires the answer in <answer> tags)",
    "tag_count": "think_format (open-r1's tag_count gives partial credit per tag)",
    "length": "length_penalty (open-r1's length scores correct answers by length among the group)",
    "soft_overlong_punishment": "length_penalty (open-r1's punishes only past a soft limit)",
}


# open-r1's GRPOScriptArguments.reward_funcs default: what a recipe without the key trains with there.
OPEN_R1_DEFAULT = ("accuracy", "format", "tag_count")


def carry_rewards(keys: Ledger) -> None:
    """GRPO's and RLOO's reward arguments: the functions adapterd ships by name, a reward model by
    id, and trl's reward_weights (model first, then the functions, as trl's script orders them)."""
    weights = keys.get("reward_weights")
    weights = list(weights) if isinstance(weights, list) else None
    slots: list[dict[str, Any] | None] = []
    rewards: dict[str, Any] = {}
    if keys.get("reward_model_name_or_path"):
        rewards["model"] = {"id": keys.config["reward_model_name_or_path"]}
        slots.append(rewards["model"])
    names = keys.get("reward_funcs") or []
    for index, name in enumerate([names] if isinstance(names, str) else names):
        if name in REWARD_FUNCTIONS:
            rewards.setdefault("functions", []).append({"name": REWARD_FUNCTIONS[name]})
            slots.append(rewards["functions"][-1])
        else:
            closest = f"; the closest is {OPEN_R1_CLOSEST[name]}: name it in rewards.functions if it will do" if name in OPEN_R1_CLOSEST else ""
            keys.dropped.append(Dropped(f"reward_funcs.{index}", f"{name} is not a reward adapterd ships ({SHIPPED}); "
                                        f"a request never names code to import{closest}"))
            slots.append(None)
    if weights is not None:
        if len(weights) != len(slots):
            keys.error("rewards", f"reward_weights: {len(weights)} weights for {len(slots)} rewards")
        for slot, weight in zip(slots, weights, strict=False):
            if slot is not None:
                slot["weight"] = weight
    if rewards:
        keys.request["rewards"] = rewards
        keys.origin["rewards"] = "reward_funcs"
    elif not names and not keys.config.get("reward_model_name_or_path"):
        # open-r1's GRPO recipes leave reward_funcs out for its script's own default; trl's CLI has none.
        message = f"the file names no reward (reward_funcs, reward_model_name_or_path): name one ({SHIPPED}, or a reward model)"
        if keys.request.get("method") == "grpo":
            closest = "; ".join(f"{name}: {OPEN_R1_CLOSEST[name]}" for name in OPEN_R1_DEFAULT)
            message += (f". open-r1's script would use its default, {', '.join(OPEN_R1_DEFAULT)}, which adapterd does not ship; "
                        f"the closest it ships: {closest}")
        keys.error("rewards", message)
