"""The verifiable reward functions adapterd ships for `grpo`, `rloo` and `online_dpo`, chosen by name
in a request: every function of TRL's `trl.rewards` (schemas/rewards.py's TRL_REWARDS), adapterd's own
and open-r1's tag_count.

A request picks from this fixed set (or names a reward model by repo id); it can never name code
to import. Each function takes TRL's reward-function arguments and returns one float (or None, "not
given") per completion. The math rewards run TRL's functions in a worker process with a hard kill
(handlers/toolkit/rewards/math_verifier.py); the others run TRL's functions here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trl.rewards import get_repetition_penalty_reward, get_soft_overlong_punishment, think_format_reward

from handlers.protocol import JobFailed, JobSpec
from handlers.toolkit.loading import resolve_model
from handlers.toolkit.rewards.math_verifier import verifier
from schemas.regex import compile_pattern
from schemas.request import (
    AccuracyReward,
    CosineScaledReward,
    ExactMatchReward,
    LengthPenaltyReward,
    OnlineRewards,
    ReasoningAccuracyReward,
    RegexReward,
    RepetitionPenaltyReward,
    RewardFunction,
    SoftOverlongPunishmentReward,
    TagCountReward,
    ThinkFormatReward,
)

RewardFn = Callable[..., list[float | None]]  # TRL's type: None is a reward a function does not give


def completion_text(completion: Any) -> str:
    """A completion as text: plain, or the content of the last message of a conversation."""
    if isinstance(completion, list):
        return str(completion[-1]["content"]) if completion else ""
    return str(completion)


def exact_match(spec: ExactMatchReward) -> RewardFn:
    def exact_match(completions: list[Any], **columns: Any) -> list[float | None]:
        references = columns[spec.column]
        return [
            float(completion_text(c).strip() == str(r).strip()) for c, r in zip(completions, references, strict=True)
        ]

    return exact_match


def regex_match(spec: RegexReward) -> RewardFn:
    pattern = compile_pattern(spec.pattern)  # RE2, as intake checked it: linear time, no catastrophic backtracking

    def regex_match(completions: list[Any], **columns: Any) -> list[float | None]:
        return [float(pattern.search(completion_text(c)) is not None) for c in completions]

    return regex_match


def length_penalty(spec: LengthPenaltyReward) -> RewardFn:
    def length_penalty(completions: list[Any], **columns: Any) -> list[float | None]:
        return [-abs(len(completion_text(c)) - spec.target_chars) / spec.target_chars for c in completions]

    return length_penalty


def think_format(spec: ThinkFormatReward) -> RewardFn:
    def think_format(completions: list[Any], **columns: Any) -> list[float | None]:
        # TRL's function reads conversational completions; plain ones are wrapped the same way.
        as_messages = [c if isinstance(c, list) else [{"role": "assistant", "content": str(c)}] for c in completions]
        return [float(r) for r in think_format_reward(as_messages)]

    return think_format


MathSpec = AccuracyReward | ReasoningAccuracyReward | CosineScaledReward


def math_reward(spec: MathSpec) -> RewardFn:
    """TRL's accuracy_reward, reasoning_accuracy_reward or get_cosine_scaled_reward, run by the
    math-verify worker against the row's solution column."""
    params = spec.model_dump(exclude={"name", "weight", "column"})

    def scored(
        completions: list[Any], completion_ids: list[list[int]] | None = None, **columns: Any
    ) -> list[float | None]:
        lengths = [len(ids) for ids in completion_ids] if completion_ids is not None else [0] * len(completions)
        items = [
            (completion_text(c), str(s), n) for c, s, n in zip(completions, columns[spec.column], lengths, strict=True)
        ]
        return verifier().score(spec.name, params, items)

    scored.__name__ = spec.name  # TRL logs each function's mean under its __name__
    return scored


def token_reward(spec: RepetitionPenaltyReward | SoftOverlongPunishmentReward) -> RewardFn:
    """TRL's get_repetition_penalty_reward or get_soft_overlong_punishment: they read the completion's token ids."""
    params = spec.model_dump(exclude={"name", "weight"})
    trl_reward = (
        get_repetition_penalty_reward(**params)
        if spec.name == "repetition_penalty"
        else get_soft_overlong_punishment(**params)
    )

    def scored(completions: list[Any], completion_ids: list[list[int]], **columns: Any) -> list[float | None]:
        return [float(r) for r in trl_reward(completion_ids=completion_ids)]

    scored.__name__ = spec.name
    return scored


# open-r1's tag_count_reward's tags: each found exactly once is worth a quarter.
TAGS = ("<think>\n", "\n</think>\n", "\n<answer>\n", "\n</answer>")


def tag_count(spec: TagCountReward) -> RewardFn:
    def tag_count(completions: list[Any], **columns: Any) -> list[float | None]:
        return [float(sum(0.25 for tag in TAGS if completion_text(c).count(tag) == 1)) for c in completions]

    return tag_count


REWARD_FUNCTIONS: dict[str, Callable[[Any], RewardFn]] = {
    "exact_match": exact_match,
    "regex_match": regex_match,
    "length_penalty": length_penalty,
    "think_format": think_format,
    "accuracy": math_reward,
    "reasoning_accuracy": math_reward,
    "cosine_scaled": math_reward,
    "repetition_penalty": token_reward,
    "soft_overlong_punishment": token_reward,
    "tag_count": tag_count,
}


def columns_needed(spec: RewardFunction) -> set[str]:
    return (
        {spec.column}
        if isinstance(spec, ExactMatchReward | AccuracyReward | ReasoningAccuracyReward | CosineScaledReward)
        else set()
    )


def check_reward_columns(rewards: OnlineRewards, dataset_columns: list[str]) -> None:
    for index, spec in enumerate(rewards.functions):
        missing = columns_needed(spec) - set(dataset_columns)
        if missing:
            raise JobFailed(
                "dataset_invalid",
                "preflight",
                f"rewards.functions.{index}: {spec.name} needs column(s) {sorted(missing)}; found {dataset_columns}",
            )


def load_rewards(rewards: OnlineRewards, job: JobSpec) -> tuple[list[RewardFn | str], list[float]]:
    """What GRPO, RLOO and online DPO score completions with: `reward_functions`, the reward model
    (when the request names one) downloaded first, under the job's bound on a model's size."""
    path = resolve_model(rewards.model, "rewards.model", max_bytes=job.max_model_bytes)[0] if rewards.model else None
    return reward_functions(rewards, path)


def reward_functions(rewards: OnlineRewards, reward_model_path: str | None) -> tuple[list[RewardFn | str], list[float]]:
    """TRL's `reward_funcs` and `reward_weights`: the named functions, then the reward model's path."""
    functions: list[RewardFn | str] = []
    weights: list[float] = []
    for spec in rewards.functions:
        functions.append(REWARD_FUNCTIONS[spec.name](spec))
        weights.append(spec.weight)
    if rewards.model is not None:
        assert reward_model_path is not None
        functions.append(reward_model_path)
        weights.append(rewards.model.weight)
    return functions, weights
