"""Keys of a `trl` CLI file that TRL or transformers renamed or removed since the recipe was written:
a reviewed table with the release of each, so that an older recipe keeps its training. A renamed key
is read under today's name and said on a line of its own; a removed key is left out naming what
replaced it, or why nothing did. A file that sets the old and the new name to different values is
an error naming both.

`tests/daemon/cli/test_convert.py` holds the table to the locked TRL: every new name is a key its parser
takes for the methods of its row, and no old name is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from daemon.cli.convert.ledger import Changed, Dropped, Ledger, Renamed, same_value
from schemas.methods import METHODS

ALL_METHODS = frozenset(METHODS)


@dataclass(frozen=True)
class Rename:
    """One row: `old` is read as `new` in a file for one of `methods`. With `fraction`, only a value
    in [0, 1) carries: the new key reads 1 and more as a count, not a ratio."""

    renamed: Renamed
    methods: frozenset[str] = ALL_METHODS
    fraction: bool = False


@dataclass(frozen=True)
class Removed:
    """A key with no new name: left out, with the release that removed it and what took its place."""

    key: str
    release: str
    instead: str
    methods: frozenset[str] = ALL_METHODS


# Releases read from TRL's git tags and from transformers' wheels on PyPI (the deprecation
# warning's release first, then the one that removed the old name).
RENAMES: tuple[Rename, ...] = (
    Rename(
        Renamed(
            "torch_dtype",
            "dtype",
            "trl 0.27.0",
            "deprecated in 0.23.0, as transformers 4.56 renamed from_pretrained's argument",
        )
    ),
    Rename(Renamed("evaluation_strategy", "eval_strategy", "transformers 4.51.0", "deprecated in 4.41.0")),
    Rename(
        Renamed(
            "warmup_ratio",
            "warmup_steps",
            "transformers 5.15.0",
            "deprecated in 5.0.0; warmup_steps under 1 is a fraction of the steps",
        ),
        fraction=True,
    ),
    Rename(Renamed("max_seq_length", "max_length", "trl 0.20.0", "deprecated in 0.16.0"), frozenset({"sft"})),
    Rename(Renamed("use_liger", "use_liger_kernel", "trl 0.18.0", "deprecated in 0.16.0"), frozenset({"sft"})),
    Rename(
        Renamed("use_liger_loss", "use_liger_kernel", "trl 0.28.0", "deprecated in 0.25.0"),
        frozenset({"dpo", "kto", "grpo"}),
    ),
    Rename(
        Renamed("vllm_guided_decoding_regex", "vllm_structured_outputs_regex", "trl 0.28.0", "deprecated in 0.27.0"),
        frozenset({"grpo"}),
    ),
    Rename(
        Renamed("wandb_log_unique_prompts", "log_unique_prompts", "trl 0.27.0", "deprecated in 0.26.0"),
        frozenset({"grpo"}),
    ),
)


@dataclass(frozen=True)
class RenamedValue:
    """A value of a key that TRL renamed (the key kept its name): read as today's value, said."""

    key: str
    old: str | bool
    new: str
    release: str
    why: str
    methods: frozenset[str] = ALL_METHODS


# Read from TRL's git tags: SFTConfig of v0.19.1 takes "ffd", of v0.20.0 "bfd" only; GRPOConfig's scale_rewards took a
# bool before v0.23.0 (trl#3992), and its __post_init__ still reads one as the value it meant.
RENAMED_VALUES: tuple[RenamedValue, ...] = (
    RenamedValue(
        "packing_strategy",
        "ffd",
        "bfd",
        "trl 0.20.0",
        "the same packing: trl's 'ffd' was best-fit decreasing all along (trl#3696)",
        frozenset({"sft"}),
    ),
    *(
        RenamedValue(
            "scale_rewards",
            old,
            new,
            "trl 0.23.0",
            "GRPOConfig's __post_init__ reads it so, the same scaling (trl#3992)",
            frozenset({"grpo"}),
        )
        for old, new in ((True, "group"), (False, "none"))
    ),
)

_FILTER = "filter overlong prompts out of the dataset before training"
REMOVED: tuple[Removed, ...] = (
    Removed(
        "overwrite_output_dir",
        "transformers 5.0.0",
        "nothing replaced it; each job writes to a fresh folder of its own",
    ),
    Removed(
        "logging_dir", "transformers 5.15.0", "TensorBoard's folder is the host's (the operator's tensorboard_dir)"
    ),
    Removed(
        "max_prompt_length",
        "trl 0.28.0",
        f"GRPO no longer truncates prompts: {_FILTER}; max_completion_length still caps completions",
        frozenset({"grpo"}),
    ),
    Removed("max_prompt_length", "trl 0.29.0", f"RLOO no longer truncates prompts: {_FILTER}", frozenset({"rloo"})),
    Removed(
        "max_prompt_length",
        "trl 0.29.0",
        f"max_length caps prompt and completion together; {_FILTER}",
        frozenset({"dpo"}),
    ),
    Removed(
        "max_completion_length", "trl 0.29.0", "max_length caps prompt and completion together", frozenset({"dpo"})
    ),
    Removed(
        "max_prompt_length",
        "trl 0.28.0",
        f"max_length caps prompt and completion together; {_FILTER}",
        frozenset({"orpo"}),
    ),
    Removed(
        "vllm_device",
        "trl 0.18.0",
        "vllm_mode chose between a vLLM server (the host's vllm_server_base_url) and colocated vLLM",
        frozenset({"grpo"}),
    ),
    Removed(
        "vllm_dtype", "trl 0.18.0", "vLLM loads the model in the dtype of its own configuration", frozenset({"grpo"})
    ),
    Removed("vllm_enable_prefix_caching", "trl 0.18.0", "no GRPOConfig field replaced it", frozenset({"grpo"})),
    Removed(
        "vllm_max_model_len",
        "trl 0.18.0",
        "vllm_max_model_length (since trl 0.26.0) sets the vLLM context",
        frozenset({"grpo"}),
    ),
)


def carry_renames(ledger: Ledger, method: str, request_path: Callable[[str], str]) -> None:
    """Read each old name of the file under its new one, so that the new key goes where today's
    file would send it (`ledger.renamed` says each); name each removed key in `ledger.dropped`.
    `request_path` gives the request field a key of today's file goes to, for the errors."""
    for row in RENAMES:
        old, new, release = row.renamed.old, row.renamed.new, row.renamed.release
        if method not in row.methods or not ledger.has(old):
            continue
        value = ledger.get(old)
        if row.fraction and not (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < 1):
            ledger.error(
                request_path(new),
                f"{old} {value!r} has no {new} to carry it as: {new} reads a fraction only under 1; "
                f"give {new} as a count of steps",
            )
        elif not ledger.has(new):
            ledger.config[new] = value
            ledger.renamed.append(row.renamed)
        elif same_value(value, ledger.config[new]):
            ledger.dropped.append(Dropped(old, f"already said by {new}, its name since {release}"))
        else:
            ledger.error(
                request_path(new),
                f"{old} (its name before {release}) and {new} are both set, to different values; keep one",
            )
    for value in RENAMED_VALUES:
        found = ledger.config.get(value.key)
        # `is` for a bool: YAML's `1` is not `true` to TRL's parser, and 1 == True in Python.
        if method in value.methods and (found is value.old if isinstance(value.old, bool) else found == value.old):
            ledger.config[value.key] = value.new
            ledger.changed.append(
                Changed(value.key, f"its value {value.old!r} is {value.new!r} since {value.release}: {value.why}")
            )
    for removed in REMOVED:
        if method in removed.methods and ledger.has(removed.key):
            ledger.get(removed.key)
            ledger.dropped.append(Dropped(removed.key, f"removed in {removed.release}: {removed.instead}"))
