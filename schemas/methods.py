"""The methods adapterd knows, in one table: the single source of what a method is.

Each row names the method's handler module (`handlers/methods/<handler>.py`; an experimental method's
in `handlers/methods/experimental/`), the TRL trainer and config
classes it trains with, whether it is stable or on TRL's experimental layer, the dataset columns it
reads (in words, for docs/methods.md), whether it trains vision-language models on rows with images, and
the TRL releases that ship it. Everything else that lists methods follows `METHODS`: the request
models by name (schemas/request.py, checked against the table by tests/schemas/test_methods.py),
the handler modules the child imports (handlers/methods/__init__.py), what this host's TRL can run
(daemon/admission/capabilities.py, `adapterd methods`) and docs/methods.md's method table (`python -m
handlers.contract.methods_doc`).

The table imports no request model, so the request models can read it (whether a method is
experimental or trains on images) without an import cycle.

This package depends on pydantic only, so TRL ranges are plain bounds compared by `release()`,
not `packaging` specifiers.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Method:
    handler: str  # the module under handlers/methods/ that trains it, dotted: "sft", "experimental.orpo"
    trainer: str  # TRL's trainer class, by the path it is imported from
    config: str  # TRL's config class
    status: Literal["stable", "experimental"]
    columns: str  # the dataset columns it reads, in words (docs/methods.md)
    vision: bool = False  # trains vision-language models on rows with images (TRL's `images` / `image` column)
    trl_min: str | None = None  # the first TRL release that ships it; None: any TRL the lock allows
    trl_below: str | None = None  # the first TRL release without it
    trl_note: str = ""  # why the range, for the refusal and docs/methods.md
    evaluates: bool = True  # its handler runs a request's `evaluation` (schemas/evaluation.py) after training

    @property
    def module(self) -> str:
        """The handler's module by its full name, e.g. "handlers.methods.experimental.orpo"."""
        return f"handlers.methods.{self.handler}"

    @property
    def trained_by(self) -> str:
        """What `succeeded` events name as the trainer, e.g. "trl.SFTTrainer/trl.SFTConfig"."""
        return f"{self.trainer}/{self.config}"

    @property
    def trl_range(self) -> str:
        """The TRL releases it needs as a specifier ("" for any), e.g. ">=1.10,<1.13"."""
        return ",".join(
            bound for bound in (self.trl_min and f">={self.trl_min}", self.trl_below and f"<{self.trl_below}") if bound
        )


# The ranges are what was seen, not remembered: `python -m handlers.contract.trl_trainers` found every row's
# trainer and config in trl 1.10.0 and 1.11.0 (scratch environments, 2026-12-03), 1.12.0 (the
# tests/trl_1_12 lane) and 1.16.0 (the lock, and the canary's newest on that day); PPO's only up to
# 1.12.0. "any" reads within pyproject's trl>=1.10; tests/handlers/test_method_table.py holds each
# lane to it.
METHODS: dict[str, Method] = {
    "sft": Method(
        "sft",
        "trl.SFTTrainer",
        "trl.SFTConfig",
        "stable",
        "`messages`, or `prompt` + `completion`, or `text`",
        vision=True,
    ),
    "dpo": Method(
        "dpo", "trl.DPOTrainer", "trl.DPOConfig", "stable", "`chosen` + `rejected` (and usually `prompt`)", vision=True
    ),
    "kto": Method("kto", "trl.KTOTrainer", "trl.KTOConfig", "stable", "`prompt` + `completion` + `label` (bool)"),
    "reward": Method("reward", "trl.RewardTrainer", "trl.RewardConfig", "stable", "`chosen` + `rejected`"),
    "grpo": Method(
        "grpo", "trl.GRPOTrainer", "trl.GRPOConfig", "stable", "`prompt` (+ columns the rewards read)", vision=True
    ),
    "rloo": Method("rloo", "trl.RLOOTrainer", "trl.RLOOConfig", "stable", "`prompt` (+ columns the rewards read)"),
    "distillation": Method(
        "distillation",
        "trl.DistillationTrainer",
        "trl.DistillationConfig",
        "stable",
        "`prompt` (the student answers; the teacher's next-token distribution is the target)",
    ),
    "orpo": Method(
        "experimental.orpo",
        "trl.experimental.orpo.ORPOTrainer",
        "trl.experimental.orpo.ORPOConfig",
        "experimental",
        "`chosen` + `rejected` (and usually `prompt`)",
    ),
    "cpo": Method(
        "experimental.cpo",
        "trl.experimental.cpo.CPOTrainer",
        "trl.experimental.cpo.CPOConfig",
        "experimental",
        "`chosen` + `rejected` (and usually `prompt`)",
    ),
    "gkd": Method(
        "experimental.gkd",
        "trl.experimental.gkd.GKDTrainer",
        "trl.experimental.gkd.GKDConfig",
        "experimental",
        "`messages` (the teacher's distribution on them, and on the student's own answers: `lmbda`)",
    ),
    "online_dpo": Method(
        "experimental.online_dpo",
        "trl.experimental.online_dpo.OnlineDPOTrainer",
        "trl.experimental.online_dpo.OnlineDPOConfig",
        "experimental",
        "`prompt` (+ columns the rewards read)",
        evaluates=False,
    ),  # OnlineDPOTrainer.evaluate() cannot run on prompt rows (it wants input_ids)
    "ppo": Method(
        "experimental.ppo",
        "trl.experimental.ppo.PPOTrainer",
        "trl.experimental.ppo.PPOConfig",
        "experimental",
        "`prompt`",
        trl_min="1.10",
        trl_below="1.13",
        evaluates=False,
        trl_note="trl.experimental.ppo lived in trl 1.10 to 1.12.0; TRL removed PPO in 1.13.0 (huggingface/trl#7020)",
    ),
}


def release(version: str) -> tuple[int, ...]:
    """The leading integers of a version string: "1.12.0" → (1, 12, 0), "1.13.0rc1" → (1, 13, 0),
    "1.10" → (1, 10). Enough for release bounds; pre-releases count as their release."""
    numbers = []
    for part in version.split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        numbers.append(int(digits.group()))
        if digits.end() < len(part):
            break  # "0rc1": the release ends here
    return tuple(numbers)


def _compare(a: str, b: str) -> int:
    x, y = release(a), release(b)
    width = max(len(x), len(y))  # "1.10" is "1.10.0"
    x, y = x + (0,) * (width - len(x)), y + (0,) * (width - len(y))
    return (x > y) - (x < y)


def unsupported_reason(method: str, trl_version: str | None) -> str | None:
    """Why a host with this TRL (None: not installed) cannot run `method`, or None when it can."""
    if trl_version is None:
        return "trl is not installed on this host"
    row = METHODS[method]
    too_old = row.trl_min is not None and _compare(trl_version, row.trl_min) < 0
    too_new = row.trl_below is not None and _compare(trl_version, row.trl_below) >= 0
    if too_old or too_new:
        return f"method {method} needs trl{row.trl_range} ({row.trl_note}); this host has trl {trl_version}"
    return None
