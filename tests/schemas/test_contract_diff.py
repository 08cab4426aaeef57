"""handlers.contract.contract_diff, the readable diff of two trl_contract.json readings that `.ci/canary` prints."""

import copy
import json
from pathlib import Path

import pytest

from handlers.contract.contract_diff import diff, main

FIELD = {"type": "str", "nullable": False, "default": "a", "choices": ["a", "b"], "object": None, "help": "Pick one."}
CONTRACT = {
    "training": {
        "source": "transformers.TrainingArguments",
        "package": "transformers",
        "version": "5.0.0",
        "fields": {"learning_rate": {**FIELD, "type": "float", "default": 5e-05, "choices": None, "help": "LR."}},
    },
    "dpo": {
        "source": "trl.DPOConfig",
        "package": "trl",
        "version": "1.16.0",
        "training_defaults": {"learning_rate": 1e-06},
        "fields": {"loss_type": FIELD, "beta": {**FIELD, "type": "float", "default": 0.1, "choices": None}},
    },
    "sft": {"source": "trl.SFTConfig", "package": "trl", "version": "1.16.0", "training_defaults": {}, "fields": {}},
    "ppo": {
        "source": "trl.experimental.ppo.PPOConfig",
        "package": "trl",
        "version": "1.12.0",
        "training_defaults": {},
        "fields": {"kl_coef": {**FIELD, "type": "float", "default": 0.05, "choices": None}},
    },
}


def newer() -> dict:
    new = copy.deepcopy(CONTRACT)
    for block in ("dpo", "sft"):
        new[block]["version"] = "1.17.0"
    dpo = new["dpo"]
    dpo["fields"]["loss_type"]["choices"] = ["a", "c"]
    dpo["fields"]["beta"]["default"] = 0.2
    dpo["fields"]["gamma"] = {**FIELD, "type": "int", "default": 3, "choices": None}
    dpo["training_defaults"] = {"learning_rate": 2e-06, "warmup_ratio": 0.1}
    new["sft"]["fields"]["max_length"] = {**FIELD, "type": "int", "nullable": True, "default": None, "choices": None}
    new["training"]["fields"]["learning_rate"]["help"] = "The learning rate."
    del new["ppo"]["fields"]["kl_coef"]
    return new


def test_each_kind_of_change_has_its_line_and_count() -> None:
    lines, counts = diff(CONTRACT, newer())
    text = "\n".join(lines)
    assert "dpo (trl.DPOConfig, trl 1.16.0 -> 1.17.0)" in text
    assert "  + gamma: int = 3" in text
    assert '  ~ loss_type: choices +"c" -"b"' in text
    assert "  ~ beta: default 0.1 -> 0.2" in text
    assert "  ~ training default learning_rate: 1e-06 -> 2e-06" in text
    assert "  ~ training default warmup_ratio: training's default -> 0.1" in text
    assert "  + max_length: int | None = null" in text
    assert "  - kl_coef: was float = 0.05" in text
    assert "transformers" not in text  # the training block: its only change is help text
    assert counts == {"added": 2, "removed": 1, "changed": 2, "training_defaults": 2, "help_only": 1}


def test_help_text_changes_show_only_when_asked() -> None:
    lines, counts = diff(CONTRACT, newer(), help_text=True)
    assert "  ~ learning_rate: help:\n      was: LR.\n      now: The learning rate." in lines
    assert counts["changed"] == 3 and counts["help_only"] == 0


def test_a_block_kept_from_an_older_release_is_named_not_counted() -> None:
    new = copy.deepcopy(CONTRACT)
    lines, counts = diff(CONTRACT, new)
    assert lines == [
        "ppo (trl.experimental.ppo.PPOConfig): no changes; kept as read from trl 1.12.0 (the "
        "other trl blocks are from 1.16.0)"
    ]
    assert sum(counts.values()) == 0


def test_blocks_added_and_removed() -> None:
    new = copy.deepcopy(CONTRACT)
    del new["ppo"]
    new["xpo"] = {**CONTRACT["sft"], "source": "trl.XPOConfig"}
    lines, counts = diff(CONTRACT, new)
    assert "+ block xpo (trl.XPOConfig, trl None -> 1.16.0): 0 fields" in lines
    assert "- block ppo (trl.experimental.ppo.PPOConfig, trl 1.12.0 -> None)" in lines
    assert counts == {"blocks_added": 1, "blocks_removed": 1}


def test_the_command_ends_with_the_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "old.json").write_text(json.dumps(CONTRACT))
    (tmp_path / "new.json").write_text(json.dumps(newer()))
    assert main([str(tmp_path / "old.json"), str(tmp_path / "new.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == "(1 fields changed only their help text; --help-text shows them)"
    assert (
        out[-1] == "contract: 7 changes (2 added, 1 removed, 2 changed, 2 training defaults changed); 1 help-text-only"
    )
    assert main([str(tmp_path / "old.json"), str(tmp_path / "missing.json")]) == 2
