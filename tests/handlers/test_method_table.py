"""The method table's TRL ranges against the TRL installed here (handlers/contract/trl_trainers.py): a method
the table says this TRL runs must have its trainer and config here, and one it says this TRL cannot
run must lack them, so a TRL that drops a trainer fails here, naming the method and the release,
instead of in a job. In the trl 1.12 lane, PPO is the method present."""

from __future__ import annotations

import pytest

from handlers.contract.trl_trainers import drift, report
from schemas.methods import METHODS


@pytest.fixture(scope="module")
def installed() -> dict[str, object]:
    return report()


@pytest.mark.parametrize("method", list(METHODS))
def test_the_tables_trl_range_agrees_with_the_installed_trl(method: str, installed: dict[str, object]) -> None:
    assert drift({**installed, "methods": {method: installed["methods"][method]}}) == []  # type: ignore[index]


def test_a_trainer_the_table_names_that_this_trl_lacks_fails_naming_the_releases(installed: dict[str, object]) -> None:
    """What the test above says when TRL drops a trainer (as 1.13 dropped PPO): here, a row for a
    trainer no TRL ships, and PPO's row as it was before 1.13 (any release), judged on this TRL."""
    from schemas.methods import unsupported_reason

    trl = installed["trl"]
    gone = {
        "trainer": "trl.experimental.gone.GoneTrainer",
        "config": "trl.experimental.gone.GoneConfig",
        "range": ">=1.10,<2",
        "present": False,
        "supported": True,
    }
    ppo = {**installed["methods"]["ppo"], "range": "any", "supported": True}  # type: ignore[index]
    problems = drift({**installed, "methods": {"gone": gone, "ppo": ppo}})
    assert problems[0] == (
        f"method gone: the table runs it on trl>=1.10,<2, and trl {trl} lacks "
        f"trl.experimental.gone.GoneTrainer or trl.experimental.gone.GoneConfig: TRL removed it by {trl}; end "
        "the row's range (trl_below) at the first release without it"
    )
    if ppo["present"]:  # the trl 1.12 lane: PPO is here, and the table's range says so
        assert problems[1:] == [] and unsupported_reason("ppo", str(trl)) is None
    else:  # the locked TRL: PPO's old row fails, and a ppo request is refused naming the releases that have it
        assert problems[1].startswith(
            f"method ppo: the table runs it on every trl release, and trl {trl} lacks trl.experimental.ppo.PPOTrainer"
        )
        assert (
            unsupported_reason("ppo", str(trl))
            == f"method ppo needs trl>=1.10,<1.13 ({METHODS['ppo'].trl_note}); this host has trl {trl}"
        )
    narrow = {**installed["methods"]["sft"], "range": "<1.0", "supported": False}  # type: ignore[index]
    assert drift({**installed, "methods": {"sft": narrow}}) == [
        f"method sft: the table runs it on trl<1.0 only, and trl {trl} has trl.SFTTrainer: widen the row's range"
    ]


def test_the_report_lists_every_trainer_the_table_runs_here(installed: dict[str, object]) -> None:
    shipped = set(installed["stable"]) | set(installed["experimental"])  # type: ignore[call-overload]
    assert "trl.SFTTrainer" in shipped
    running = [METHODS[m].trainer for m, row in installed["methods"].items() if row["supported"]]  # type: ignore[attr-defined]
    assert running and set(running) <= shipped, sorted(
        set(running) - shipped
    )  # so the canary's diff of two reports is complete


def test_the_changes_between_two_reports_name_what_trl_added_promoted_and_removed() -> None:
    from handlers.contract.trl_trainers import changes

    methods = {"ppo": {"trainer": "trl.experimental.ppo.PPOTrainer", "present": True}}
    old = {
        "trl": "1.12.0",
        "stable": ["trl.SFTTrainer"],
        "experimental": ["trl.experimental.ppo.PPOTrainer", "trl.experimental.gkd.GKDTrainer"],
        "methods": methods,
    }
    new = {
        "trl": "1.16.0",
        "stable": ["trl.SFTTrainer", "trl.GKDTrainer"],
        "experimental": ["trl.experimental.cpo.CPOTrainer"],
        "methods": {"ppo": {**methods["ppo"], "present": False}},
    }
    assert changes(old, new) == [
        "promoted from experimental: trl.GKDTrainer",
        "added: trl.experimental.cpo.CPOTrainer",
        "removed: trl.experimental.ppo.PPOTrainer",
        "method ppo: trl 1.16.0 lacks trl.experimental.ppo.PPOTrainer (trl 1.12.0 had it)",
    ]
    assert changes(old, old) == []
