"""open-r1's GRPO reward functions (src/open_r1/rewards.py's registry, as its grpo.py reads
`reward_funcs`) and what each is carried to in a request: the function adapterd ships that scores
as it does, with what differs said; or, where nothing does, why the conversion refuses it.

Read at huggingface/open-r1 1416fa0cf21595d2083b399a2a0bbddd7f6e9563 (src/open_r1/rewards.py,
src/open_r1/configs.py's GRPOScriptArguments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# GRPOScriptArguments.reward_funcs' default: what a recipe without the key trains with.
OPEN_R1_DEFAULT = ("accuracy", "format", "tag_count")

# GRPOScriptArguments' reward parameters and their defaults.
OPEN_R1_PARAMETERS: dict[str, Any] = {
    "cosine_min_value_wrong": 0.0,
    "cosine_max_value_wrong": -0.5,
    "cosine_min_value_correct": 0.5,
    "cosine_max_value_correct": 1.0,
    "cosine_max_len": 1000,
    "repetition_n_grams": 3,
    "repetition_max_penalty": -1.0,
    "code_language": "python",
    "code_eval_test_batch_size": 1,
    "code_eval_scoring_mode": "weighted_sum",
    "parallel_code_exec_per_proc": 2,
    "e2b_router_url": None,
    "morph_router_url": None,
    "code_provider": "e2b",
    "ioi_provider": "piston",
    "max_completion_len": 16384,
    "soft_punish_cache": 4096,
}
CODE_LANGUAGES = ("python", "javascript", "r", "java", "bash", "cpp")  # code_language's choices

# open-r1's format_reward pattern, `re.match`ed with DOTALL | MULTILINE, as RE2 searches it: `\A` for
# match's anchor at the start (under MULTILINE `^` would also match after any newline).
FORMAT_PATTERN = r"(?sm)\A<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$"
CODE_FORMAT_PATTERN = r"(?sm)\A<think>\n.*?\n</think>\n<answer>\n.*?```{language}.*?```.*?\n</answer>$"


@dataclass(frozen=True)
class OpenR1Reward:
    """One open-r1 reward: the request's function for it (None: refused), the ledger's line, and
    the GRPOScriptArguments keys it reads."""

    function: dict[str, Any] | None
    said: str
    reads: tuple[str, ...] = field(default=())


def open_r1_reward(name: str, parameters: dict[str, Any]) -> OpenR1Reward | None:
    """What open-r1's reward `name` is carried to, with the file's `parameters` (its
    GRPOScriptArguments keys, defaults filled in); None when open-r1 has no reward by that name."""
    if name == "accuracy":
        return OpenR1Reward(
            {"name": "accuracy"},
            (
                "carried as TRL's accuracy (open-r1's accuracy as TRL took it over: math-verify against the "
                "`solution` column, \\boxed first, a solution it cannot parse skips the row); open-r1's own "
                "parses the solution with first_match and leaves malformed operators and nits unrepaired, so an "
                "answer in odd LaTeX may score otherwise"
            ),
        )
    if name == "format":
        return OpenR1Reward(
            {"name": "regex_match", "pattern": FORMAT_PATTERN},
            "carried as regex_match with open-r1's format_reward pattern (in RE2: the same completions match)",
        )
    if name == "tag_count":
        return OpenR1Reward(
            {"name": "tag_count"}, "carried as tag_count (open-r1's tag_count_reward: a quarter per tag found once)"
        )
    if name == "soft_overlong_punishment":
        function = {
            "name": "soft_overlong_punishment",
            "max_completion_len": parameters["max_completion_len"],
            "soft_punish_cache": parameters["soft_punish_cache"],
        }
        return OpenR1Reward(
            function,
            (
                f"carried as TRL's soft_overlong_punishment (open-r1's, as TRL took it over), max_completion_len "
                f"{function['max_completion_len']}, soft_punish_cache {function['soft_punish_cache']}"
            ),
            ("max_completion_len", "soft_punish_cache"),
        )
    if name == "code_format":
        language = parameters["code_language"]
        if language not in CODE_LANGUAGES:
            return OpenR1Reward(
                None,
                f"code_language {language!r} is not one of open-r1's {', '.join(CODE_LANGUAGES)}",
                ("code_language",),
            )
        return OpenR1Reward(
            {"name": "regex_match", "pattern": CODE_FORMAT_PATTERN.format(language=language)},
            (
                f"carried as regex_match with open-r1's code_format_reward pattern for {language}; open-r1 reads a "
                "row's `language` column in its place where the dataset has one, which a pattern cannot"
            ),
            ("code_language",),
        )
    refused = REFUSED.get(name)
    return None if refused is None else OpenR1Reward(None, refused[0], refused[1])


# open-r1's rewards with no faithful counterpart: why, and the keys each reads.
REFUSED: dict[str, tuple[str, tuple[str, ...]]] = {
    "cosine": (
        "no faithful counterpart: open-r1's cosine scales by the answer's length in characters and gives 1.0 where "
        "the solution cannot be parsed; TRL's cosine_scaled counts tokens and skips the row: name it in "
        "rewards.functions if it will do",
        tuple(key for key in OPEN_R1_PARAMETERS if key.startswith("cosine_")),
    ),
    "repetition_penalty": (
        "no faithful counterpart: open-r1's counts repeated word n-grams of the text; TRL's repetition_penalty "
        "counts token n-grams: name it in rewards.functions if it will do",
        ("repetition_n_grams", "repetition_max_penalty"),
    ),
    "reasoning_steps": (
        "no faithful counterpart: open-r1's scores min(1, step markers / 3); regex_match scores 1 or 0",
        (),
    ),
    "length": (
        "no faithful counterpart: open-r1's (Kimi 1.5's) scores each answer's length "
        "against its group's, by correctness",
        (),
    ),
    **{
        name: (
            f"no counterpart: open-r1's {name} runs the completion's code in a sandbox; adapterd "
            "never runs a completion's code",
            reads,
        )
        for name, reads in (
            ("code", ("parallel_code_exec_per_proc", "code_provider", "e2b_router_url", "morph_router_url")),
            ("binary_code", ("parallel_code_exec_per_proc", "code_provider", "e2b_router_url", "morph_router_url")),
            ("ioi_code", ("code_eval_test_batch_size", "ioi_provider")),
            ("cf_code", ("code_eval_test_batch_size", "code_eval_scoring_mode")),
        )
    },
}
