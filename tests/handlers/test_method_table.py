"""The method table's TRL ranges against the TRL installed here (handlers/trl_trainers.py): a method
the table says this TRL runs must have its trainer and config here, and one it says this TRL cannot
run must lack them, so a TRL that drops a trainer fails here, naming the method and the release,
instead of in a job. In the trl 1.12 lane, PPO is the method present."""

from __future__ import annotations

import pytest

from handlers.trl_trainers import report
from schemas.methods import METHODS


@pytest.fixture(scope="module")
def installed() -> dict[str, object]:
    return report()


@pytest.mark.parametrize("method", list(METHODS))
def test_the_tables_trl_range_agrees_with_the_installed_trl(method: str, installed: dict[str, object]) -> None:
    row = installed["methods"][method]  # type: ignore[index]
    trl = installed["trl"]
    if row["supported"]:
        assert row["present"], (
            f"the method table says {method} runs on trl{row['range'] if row['range'] != 'any' else ' (any release)'}, and trl {trl} "
            f"lacks {row['trainer']} or {row['config']}: TRL removed it; set the row's trl_below to {trl} or the release before it that lacks it"
        )
    else:
        assert not row["present"], (
            f"the method table says {method} needs trl{row['range']}, and trl {trl} has {row['trainer']}: widen the row's range"
        )


def test_the_report_lists_every_trainer_the_table_runs_here(installed: dict[str, object]) -> None:
    shipped = set(installed["stable"]) | set(installed["experimental"])  # type: ignore[call-overload]
    assert "trl.SFTTrainer" in shipped
    running = [METHODS[m].trainer for m, row in installed["methods"].items() if row["supported"]]  # type: ignore[attr-defined]
    assert running and set(running) <= shipped, sorted(set(running) - shipped)  # so the canary's diff of two reports is complete


def test_the_changes_between_two_reports_name_what_trl_added_promoted_and_removed() -> None:
    from handlers.trl_trainers import changes

    methods = {"ppo": {"trainer": "trl.experimental.ppo.PPOTrainer", "present": True}}
    old = {"trl": "1.12.0", "stable": ["trl.SFTTrainer"], "experimental": ["trl.experimental.ppo.PPOTrainer", "trl.experimental.gkd.GKDTrainer"],
           "methods": methods}
    new = {"trl": "1.16.0", "stable": ["trl.SFTTrainer", "trl.GKDTrainer"], "experimental": ["trl.experimental.cpo.CPOTrainer"],
           "methods": {"ppo": {**methods["ppo"], "present": False}}}
    assert changes(old, new) == [
        "promoted from experimental: trl.GKDTrainer",
        "added: trl.experimental.cpo.CPOTrainer",
        "removed: trl.experimental.ppo.PPOTrainer",
        "method ppo: trl 1.16.0 lacks trl.experimental.ppo.PPOTrainer (trl 1.12.0 had it)",
    ]
    assert changes(old, old) == []
