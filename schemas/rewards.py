"""What scores an online method's completions (grpo, rloo): the reward functions adapterd ships,
chosen by name, and a reward model by repo id (also PPO's). A request can never name code to import.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from schemas.common import MODEL_ID_PATTERN, Frozen
from schemas.regex import pattern_problem


class ExactMatchReward(Frozen):
    """1.0 when the completion, stripped, equals the row's reference column; else 0.0."""

    name: Literal["exact_match"]
    weight: float = 1.0
    column: str = "answer"


class RegexReward(Frozen):
    """1.0 when the pattern is found in the completion (RE2 syntax, matched in linear time); else 0.0."""

    name: Literal["regex_match"]
    weight: float = 1.0
    pattern: str = Field(min_length=1, max_length=1000, description="An RE2 pattern (no look-around or back-references); searched for in each completion.")

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

