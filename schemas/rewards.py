"""What scores an online method's completions (grpo, rloo, online_dpo): the reward functions adapterd
ships, chosen by name, and a reward model by repo id (also PPO's). A request can never name code to import.

Every reward function of the locked TRL's `trl.rewards` is here under a short name (TRL_REWARDS), with
TRL's own parameters typed and bounded; tests/schemas/test_reward_drift.py holds the table to the
installed TRL (a reward TRL adds or removes, or a parameter it changes, fails there). The rest are
adapterd's own (exact_match, regex_match, length_penalty) and open-r1's tag_count.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from .common import MODEL_ID_PATTERN, Frozen
from .regex import pattern_problem


class ExactMatchReward(Frozen):
    """1.0 when the completion, stripped, equals the row's reference column; else 0.0."""

    name: Literal["exact_match"]
    weight: float = 1.0
    column: str = "answer"


class RegexReward(Frozen):
    """1.0 when the pattern is found in the completion (RE2 syntax, matched in linear time); else 0.0."""

    name: Literal["regex_match"]
    weight: float = 1.0
    pattern: str = Field(
        min_length=1,
        max_length=1000,
        description="An RE2 pattern (no look-around or back-references); searched for in each completion.",
    )

    @model_validator(mode="after")
    def _compiles(self) -> RegexReward:
        problem = pattern_problem(self.pattern)
        if problem:
            raise ValueError(f"pattern: {problem}")
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


# Bounds of TRL's reward parameters: a length in tokens no model generates past, and reward values
# of the size rewards are summed at (TRL's defaults are within [-1, 1]).
MAX_TOKENS = 262_144
MAX_VALUE = 100.0
Value = Annotated[float, Field(ge=-MAX_VALUE, le=MAX_VALUE, allow_inf_nan=False)]
Column = Annotated[str, Field(min_length=1, max_length=256)]
SOLUTION = "The column holding each row's reference answer (LaTeX or plain), read as TRL's `solution`."


class AccuracyReward(Frozen):
    """TRL's `accuracy_reward`: 1.0 when math-verify finds the completion's answer (`\\boxed{}` first)
    equal to the row's solution, 0.0 when not; a solution math-verify cannot parse skips the row (None)."""

    name: Literal["accuracy"]
    weight: float = 1.0
    column: Column = Field("solution", description=SOLUTION)


Delimiter = Annotated[str, StringConstraints(min_length=1, max_length=64)]


class ReasoningAccuracyReward(Frozen):
    """TRL's `reasoning_accuracy_reward`: accuracy on what follows the reasoning (after the last
    delimiter); 0.0 when the completion never closes its reasoning."""

    name: Literal["reasoning_accuracy"]
    weight: float = 1.0
    column: Column = Field("solution", description=SOLUTION)
    reasoning_delimiters: list[Delimiter] | None = Field(
        None, min_length=1, max_length=8, description="Where the reasoning ends; TRL's default, None, is `</think>`."
    )


class CosineScaledReward(Frozen):
    """TRL's `get_cosine_scaled_reward`: accuracy scaled by the completion's length in tokens on a
    cosine schedule (shorter correct answers score more, shorter wrong ones less)."""

    name: Literal["cosine_scaled"]
    weight: float = 1.0
    column: Column = Field("solution", description=SOLUTION)
    max_len: int = Field(
        ge=1, le=MAX_TOKENS, description="The length (tokens) at which the schedule reaches its long end."
    )
    min_value_wrong: Value = -1.0
    max_value_wrong: Value = -0.5
    min_value_correct: Value = 0.5
    max_value_correct: Value = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> CosineScaledReward:
        if not self.min_value_wrong <= self.max_value_wrong <= self.min_value_correct <= self.max_value_correct:
            raise ValueError(
                "min_value_wrong <= max_value_wrong <= min_value_correct <= max_value_correct: "
                "a wrong answer never outscores a correct one"
            )
        return self


class RepetitionPenaltyReward(Frozen):
    """TRL's `get_repetition_penalty_reward`: the share of repeated token n-grams times max_penalty."""

    name: Literal["repetition_penalty"]
    weight: float = 1.0
    ngram_size: int = Field(3, ge=1, le=64)
    max_penalty: Value = Field(-1.0, le=0.0, description="The penalty of a wholly repetitive completion; at most 0.")


class SoftOverlongPunishmentReward(Frozen):
    """TRL's `get_soft_overlong_punishment` (DAPO): 0 up to max_completion_len - soft_punish_cache
    tokens, falling linearly to -1 at max_completion_len, -1 past it."""

    name: Literal["soft_overlong_punishment"]
    weight: float = 1.0
    max_completion_len: int = Field(ge=1, le=MAX_TOKENS)
    soft_punish_cache: int = Field(ge=0, le=MAX_TOKENS)

    @model_validator(mode="after")
    def _within(self) -> SoftOverlongPunishmentReward:
        if self.soft_punish_cache > self.max_completion_len:
            raise ValueError(
                f"soft_punish_cache: {self.soft_punish_cache} is more than max_completion_len {self.max_completion_len}"
            )
        return self


class TagCountReward(Frozen):
    """open-r1's `tag_count_reward`: 0.25 for each of `<think>\\n`, `\\n</think>\\n`, `\\n<answer>\\n` and
    `\\n</answer>` found exactly once in the completion."""

    name: Literal["tag_count"]
    weight: float = 1.0


# Every reward function of the locked TRL's trl.rewards → the request's model for it. The drift test
# holds this to the installed TRL: each public function is here, and each model's fields besides
# name, weight and column are the function's parameters (a factory's, or a function's own keyword
# arguments besides those TRL passes when it scores), with TRL's defaults.
TRL_REWARDS: dict[str, type[Frozen]] = {
    "accuracy_reward": AccuracyReward,
    "reasoning_accuracy_reward": ReasoningAccuracyReward,
    "think_format_reward": ThinkFormatReward,
    "get_cosine_scaled_reward": CosineScaledReward,
    "get_repetition_penalty_reward": RepetitionPenaltyReward,
    "get_soft_overlong_punishment": SoftOverlongPunishmentReward,
}
# The fields of a reward's model that are adapterd's, not TRL's parameters.
ADAPTERD_FIELDS = frozenset({"name", "weight", "column"})

RewardFunction = Annotated[
    ExactMatchReward
    | RegexReward
    | LengthPenaltyReward
    | ThinkFormatReward
    | AccuracyReward
    | ReasoningAccuracyReward
    | CosineScaledReward
    | RepetitionPenaltyReward
    | SoftOverlongPunishmentReward
    | TagCountReward,
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
