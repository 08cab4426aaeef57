"""The request's TRL blocks against the installed TRL, transformers and PEFT, and against the files
generated from them: a change on either side fails here, naming each difference and the command
that regenerates.

In the trl 1.12 lane (tests/trl_1_12) only the `ppo` block is generated from the installed TRL; run
there, the other blocks' tests fail and say what trl 1.12 differs in (that is the drift test working).
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from typing import Any

import pytest

from handlers.contract.contract_diff import diff_block
from handlers.contract.contract_render import (
    DOC_FILE,
    MODULE_FILE,
    REGENERATE,
    render_doc,
    render_module,
)
from handlers.contract.contract_source import dataclass_of, read_contract
from handlers.contract.generate_contract import removed_fields
from schemas import contract_rules as rules
from schemas.generated import load_contract
from schemas.request import REQUEST_MODELS, ModelSpec

CHECKED_IN = load_contract()
INSTALLED = [block for block, source in rules.BLOCK_SOURCES.items() if dataclass_of(source) is not None]


def differences(block: str, old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two readings of one block, one line each (handlers/contract/contract_diff.py's
    report, help text included: the generated descriptions are made of it)."""
    found = diff_block(block, old, new, help_text=True, counts=Counter())
    if old["version"] != new["version"]:
        found.insert(0, f"  {old['package']} {old['version']} -> {new['version']}")
    return found


@pytest.mark.parametrize("block", INSTALLED)
def test_the_installed_library_matches_the_checked_in_contract(block: str) -> None:
    fresh = read_contract([block])[block]
    found = differences(block, CHECKED_IN[block], fresh)
    assert not found, (
        f"{rules.BLOCK_SOURCES[block]} differs from schemas/trl_contract.json:\n"
        + "\n".join(found)
        + f"\nregenerate with: {REGENERATE}"
        + (" ppo" if block == "ppo" else "")
    )


def test_the_generated_module_and_reference_match_the_contract() -> None:
    assert MODULE_FILE.read_text() == render_module(CHECKED_IN), f"schemas/trl_fields.py is stale: {REGENERATE}"
    assert DOC_FILE.read_text() == render_doc(CHECKED_IN), f"docs/requests.md is stale: {REGENERATE}"


@pytest.mark.parametrize("block", [b for b in INSTALLED if b not in rules.SHARED_BLOCKS])
def test_every_field_of_a_method_config_is_settable_or_refused_with_a_reason(block: str) -> None:
    """Each field of the installed config class (inherited TrainingArguments ones too) is a field of
    the method's request (its block, `training`) or is in the refusal table."""
    config = dataclass_of(rules.BLOCK_SOURCES[block])
    method = next(name for name, model in REQUEST_MODELS.items() if name == block)
    request = REQUEST_MODELS[method]
    method_block = request.model_fields[block].annotation
    training = request.model_fields["training"].annotation
    neither = []
    for field in dataclasses.fields(config):
        settable = field.name in method_block.model_fields or field.name in training.model_fields
        refused = rules.refusal(block, field.name) or rules.refusal("training", field.name)
        if settable == bool(refused):
            neither.append(
                f"{field.name}: {'both settable and refused' if settable else 'neither settable nor refused'}"
            )
    assert not neither and len(dataclasses.fields(config)) > 100, neither


@pytest.mark.parametrize("block", ["peft", "model"])
def test_every_lora_and_model_config_field_is_settable_or_refused_or_said_elsewhere(block: str) -> None:
    config = dataclass_of(rules.BLOCK_SOURCES[block])
    spec = ModelSpec if block == "model" else REQUEST_MODELS["sft"].model_fields["peft"].annotation.__args__[0]
    neither = [
        field.name
        for field in dataclasses.fields(config)
        if field.name not in spec.model_fields
        and rules.refusal(block, field.name) is None
        and not (block == "model" and field.name in rules.MODEL_CONFIG_PATHS)
    ]
    assert not neither


def _fields_anywhere(block: str) -> set[str]:
    blocks = [block] if block != "*" else [b for b in CHECKED_IN if b not in rules.SHARED_BLOCKS]
    return set().union(*(CHECKED_IN[b]["fields"] for b in blocks))


@pytest.mark.parametrize(
    "table", ["REFUSED", "CHOICES", "HELP_CHOICES", "BOUNDS", "DEFAULTS", "TYPES", "SETTABLE_UNDER_POLICY"]
)
def test_every_rule_names_a_real_field(table: str) -> None:
    stale = [
        f"{block}.{name}"
        for block, entries in getattr(rules, table).items()
        for name in entries
        if name not in _fields_anywhere(block)
    ]
    assert not stale, f"{table} names fields the contract does not have: {stale}"


def test_every_model_config_path_names_a_real_field() -> None:
    model_config = dataclass_of("trl.ModelConfig")
    assert set(rules.MODEL_CONFIG_PATHS) <= {f.name for f in dataclasses.fields(model_config)}


def test_a_renamed_field_is_accepted_under_its_old_name_and_marked_deprecated(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a TRL rename does: the old name stays in the contract, deprecated, and reaches TRL under the new one."""
    monkeypatch.setitem(rules.RENAMED, "sft", {"max_seq_length": "max_length"})
    # Run as a module of the schemas package would be: the generated text imports its base relatively.
    namespace: dict[str, Any] = {"__name__": "schemas.trl_fields_renamed", "__package__": "schemas"}
    exec(compile(render_module(CHECKED_IN), "trl_fields_renamed", "exec"), namespace)  # our own generated text
    block = namespace["SFTConfigFields"]
    block.model_rebuild(_types_namespace=namespace)
    assert block.model_json_schema()["properties"]["max_seq_length"]["deprecated"] is True
    assert block.model_validate({"max_seq_length": 77}).set_fields() == {"max_length": 77}


def test_a_field_removed_from_trl_is_named_until_renamed() -> None:
    old = {"sft": {"fields": {"max_seq_length": {}, "packing": {}}}}
    new = {"sft": {"fields": {"max_length": {}, "packing": {}}}}
    assert removed_fields(old, new) == ["sft.max_seq_length"]


def test_a_help_text_choice_list_is_read_from_its_sentence() -> None:
    from handlers.contract.contract_source import help_choices

    assert help_choices("Supported values are 'grpo', 'dapo', and 'cispo'. 'grpo': averages per 'sequence'.") == [
        "grpo",
        "dapo",
        "cispo",
    ]
    assert help_choices("Possible values are: `reverse_kl` (default), `forward_kl`. Only 'sigmoid' supports it.") == [
        "reverse_kl",
        "forward_kl",
    ]


def test_the_loss_types_and_schedulers_are_trls_own() -> None:
    """The two drifts that hand-copied lists had: GRPO's loss types and transformers' schedulers."""
    grpo = REQUEST_MODELS["grpo"].model_fields["grpo"].annotation.model_fields["loss_type"].annotation
    assert {"cispo", "sapo", "luspo", "vespo"} <= set(typing.get_args(grpo))
    from transformers.trainer_utils import SchedulerType

    scheduler = REQUEST_MODELS["sft"].model_fields["training"].annotation.model_fields["lr_scheduler_type"].annotation
    assert set(typing.get_args(scheduler)) == {s.value for s in SchedulerType}


def test_the_requests_doc_starts_with_every_block_of_a_request_and_regenerating_keeps_it() -> None:
    """docs/requests.md opens with the request's own blocks (model, dataset, output, evaluation,
    rewards, ...), one row each in the hand-written part, before the generated tables; regenerating
    keeps that part as it is (issue 49)."""
    from handlers.contract.contract_render import GENERATED_MARKER, doc_head

    text = DOC_FILE.read_text()
    head = doc_head()
    assert head and text.startswith(head) and text.index(GENERATED_MARKER) < text.index('<a id="training"></a>')
    rows = {
        cell.strip("` ")
        for line in head.splitlines()
        if line.startswith("| `")
        for cell in line.split("|")[1].split(",")
    }
    blocks = {name for model in REQUEST_MODELS.values() for name in model.model_fields} - set(REQUEST_MODELS)
    assert blocks <= rows, f"blocks with no row in docs/requests.md: {sorted(blocks - rows)}"
    assert "<method>` (`sft`" in head  # the method's own block, by its name
    assert render_doc(CHECKED_IN).startswith(head) and render_doc(CHECKED_IN, head="").startswith("# Request fields")
