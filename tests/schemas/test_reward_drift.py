"""The reward functions a request can name against the locked TRL's `trl.rewards`: every function TRL
ships is one, with TRL's parameters and defaults; a reward TRL adds, removes or changes fails here."""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
import trl.rewards

from handlers.contract.trl_rewards import reward_drift, trl_functions
from schemas.rewards import TRL_REWARDS, RewardFunction


def test_every_reward_trl_ships_is_named_with_its_parameters() -> None:
    assert reward_drift(trl.rewards) == []
    assert set(trl_functions(trl.rewards)) == set(TRL_REWARDS) and len(TRL_REWARDS) >= 6


def test_each_trl_reward_is_one_a_request_names() -> None:
    named = set(typing.get_args(typing.get_args(RewardFunction)[0]))
    assert set(TRL_REWARDS.values()) <= named


def _trl_like(**changes: Any) -> types.SimpleNamespace:
    """trl.rewards as a release might have it: its functions, with `changes` (None removes one)."""
    functions = {**trl_functions(trl.rewards), **changes}
    functions = {name: function for name, function in functions.items() if function is not None}
    return types.SimpleNamespace(
        __all__=["accuracy_rewards", *functions], accuracy_rewards=trl.rewards.accuracy_rewards, **functions
    )


def test_a_reward_trl_adds_fails_the_drift_test() -> None:
    def get_language_consistency_reward(language: str = "en") -> Any:
        raise AssertionError("never called")

    found = reward_drift(_trl_like(get_language_consistency_reward=get_language_consistency_reward))
    assert found == [
        "trl.rewards.get_language_consistency_reward: a reward TRL ships that a request cannot name: "
        "add it to TRL_REWARDS in schemas/rewards.py"
    ]


def test_a_reward_trl_removes_fails_the_drift_test() -> None:
    found = reward_drift(_trl_like(get_soft_overlong_punishment=None))
    assert found == [
        "trl.rewards.get_soft_overlong_punishment: gone from TRL: remove "
        "SoftOverlongPunishmentReward from schemas/rewards.py"
    ]


@pytest.mark.parametrize(
    ("replacement", "expected"),
    [
        (
            "def get_repetition_penalty_reward(ngram_size: int = 4, max_penalty: float = -1.0): ...",
            "RepetitionPenaltyReward.ngram_size: default 3, TRL's 4",
        ),
        (
            "def get_repetition_penalty_reward(ngram_size: int = 3, max_penalty: float = "
            "-1.0, unit: str = 'token'): ...",
            "trl.rewards.get_repetition_penalty_reward(unit): a parameter RepetitionPenaltyReward lacks",
        ),
        (
            "def get_repetition_penalty_reward(max_penalty: float = -1.0): ...",
            "RepetitionPenaltyReward.ngram_size: not a parameter of trl.rewards.get_repetition_penalty_reward",
        ),
    ],
)
def test_a_parameter_trl_changes_fails_the_drift_test(replacement: str, expected: str) -> None:
    namespace: dict[str, Any] = {}
    exec(replacement, namespace)  # a stand-in of our own: TRL's function as a later release might define it
    assert reward_drift(_trl_like(get_repetition_penalty_reward=namespace["get_repetition_penalty_reward"])) == [
        expected
    ]
