"""The reward functions a request names, each wired to TRL's own: the same values TRL's function
gives on the same completions (the math ones through the math-verify worker), and what a hostile
answer or solution can cost bounded by the worker's hard kill."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from trl.rewards import (
    accuracy_reward,
    get_cosine_scaled_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
    think_format_reward,
)

from handlers.toolkit.rewards import reward_functions
from handlers.toolkit.rewards.math_verifier import MathVerifier
from schemas.request import OnlineRewards

ANSWERS = [
    "<think>\nadding\n</think>\n<answer>\nThe sum is \\boxed{\\frac{1}{3}}\n</answer>",
    "<think>\nadding\n</think> so \\boxed{\\frac{1}{2}}",
    "I think it is \\boxed{\\frac{1}{3}}",
    "no answer at all, no answer at all, no answer at all",
]
SOLUTIONS = ["$\\frac{1}{3}$"] * len(ANSWERS)
IDS = [[1, 2, 3, 4] * 3, [5] * 20, [1, 2], list(range(40))]
MESSAGES = [[{"role": "assistant", "content": a}] for a in ANSWERS]


def scored(function: dict[str, Any], completions: list[Any] = ANSWERS, **columns: Any) -> list[float | None]:
    [reward], [weight] = reward_functions(OnlineRewards.model_validate({"functions": [function]}), None)
    assert not isinstance(reward, str) and weight == function.get("weight", 1.0)
    return reward(
        prompts=["q"] * len(completions),
        completions=completions,
        completion_ids=IDS,
        **{"solution": SOLUTIONS, **columns},
    )


@pytest.mark.parametrize(
    ("function", "trl"),
    [
        ({"name": "accuracy"}, lambda: accuracy_reward(MESSAGES, SOLUTIONS)),
        ({"name": "reasoning_accuracy"}, lambda: reasoning_accuracy_reward(MESSAGES, SOLUTIONS)),
        (
            {"name": "reasoning_accuracy", "reasoning_delimiters": ["is"]},
            lambda: reasoning_accuracy_reward(MESSAGES, SOLUTIONS, reasoning_delimiters=["is"]),
        ),
        (
            {"name": "cosine_scaled", "max_len": 30, "min_value_wrong": -2.0},
            lambda: get_cosine_scaled_reward(max_len=30, min_value_wrong=-2.0)(MESSAGES, SOLUTIONS, IDS),
        ),
        (
            {"name": "repetition_penalty", "ngram_size": 2, "max_penalty": -0.5, "weight": 0.3},
            lambda: get_repetition_penalty_reward(ngram_size=2, max_penalty=-0.5)(IDS),
        ),
        (
            {"name": "soft_overlong_punishment", "max_completion_len": 30, "soft_punish_cache": 20},
            lambda: get_soft_overlong_punishment(max_completion_len=30, soft_punish_cache=20)(IDS),
        ),
        ({"name": "think_format"}, lambda: think_format_reward(MESSAGES)),
    ],
)
def test_each_trl_reward_by_name_gives_trls_values(function: dict[str, Any], trl: Any) -> None:
    expected = trl()
    assert scored(function) == expected
    assert len(set(expected)) > 1  # the rows tell the function's cases apart: a constant would not pass


def test_the_math_rewards_read_the_named_column_and_conversations() -> None:
    assert scored(
        {"name": "accuracy", "column": "answer"}, completions=MESSAGES, answer=SOLUTIONS, solution=["$7$"] * 4
    ) == [1.0, 0.0, 1.0, 0.0]


def test_open_r1s_tag_count_gives_a_quarter_per_tag_found_once() -> None:
    answers = [ANSWERS[0], "<think>\nx\n</think>\n", "<think>\n<think>\n\n</answer>", ""]
    assert scored({"name": "tag_count"}, completions=answers) == [1.0, 0.5, 0.25, 0.0]


# Hostile LaTeX: each costs math-verify seconds (benchmarks/math_verify_hostile.py measures them).
NESTED = "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}"


def test_a_hostile_answer_is_killed_and_scored_as_one_trl_cannot_parse() -> None:
    verifier = MathVerifier(item_seconds=1.0)
    try:
        rewards = verifier.score(
            "accuracy", {}, [("\\boxed{4}", "$4$", 3), (NESTED, "$1$", 3), ("\\boxed{1}", "$1$", 3)]
        )
        assert rewards == [1.0, 0.0, 1.0] and verifier.kills == 1  # the worker was restarted for the third
        cosine = verifier.score(
            "cosine_scaled",
            {
                "max_len": 10,
                "min_value_wrong": -1.0,
                "max_value_wrong": -0.5,
                "min_value_correct": 0.5,
                "max_value_correct": 1.0,
            },
            [(NESTED, "$1$", 10)],
        )
        assert (
            cosine == [-0.5] and verifier.kills == 2
        )  # the wrong answer's value at max_len, as TRL gives an unparseable one
    finally:
        verifier.close()


def test_a_hostile_solution_skips_the_row_and_a_call_stops_at_its_budget() -> None:
    verifier = MathVerifier(item_seconds=1.0, call_seconds=0.5)
    try:
        rewards = verifier.score(
            "accuracy", {}, [("\\boxed{1}", NESTED, 1), ("\\boxed{1}", "$1$", 1), ("\\boxed{2}", "$2$", 1)]
        )
        # The first row: killed after 1 s, past the call's 0.5 s: not scored again as an empty answer but
        # None, TRL's "not given"; the other two are not checked, None too.
        assert rewards == [None, None, None] and verifier.kills == 1
        assert verifier.score("accuracy", {}, [("\\boxed{1}", "$1$", 1)]) == [1.0]  # the next call has its own budget
    finally:
        verifier.close()
    verifier = MathVerifier(item_seconds=1.0)
    try:
        rewards = verifier.score("accuracy", {}, [("\\boxed{1}", NESTED, 1), ("\\boxed{1}", "$1$", 1)])
        assert rewards == [None, 1.0] and verifier.kills == 2  # killed as given and as an empty answer: the row skipped
    finally:
        verifier.close()


def test_the_math_rewards_are_bounded_off_the_main_thread_too() -> None:
    """Where TRL's own accuracy_reward runs in a thread, math-verify's alarms are off and nothing
    bounds it; the worker's main thread has them, and the kill besides."""
    verifier = MathVerifier(item_seconds=1.0)
    found: list[Any] = []
    thread = threading.Thread(
        target=lambda: found.append(verifier.score("accuracy", {}, [(NESTED, "$1$", 1), ("\\boxed{1}", "$1$", 1)]))
    )
    try:
        thread.start()
        thread.join()
        assert found == [[0.0, 1.0]] and verifier.kills == 1
    finally:
        verifier.close()
