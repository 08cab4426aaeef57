"""The method table is the single source: docs/methods.md's table, the TRL ranges and the request models
are read from it, and every method in it has what a method needs in the repository."""

import ast
from pathlib import Path

import pytest

from handlers.contract.methods_doc import markdown_table, readme_table
from schemas.methods import METHODS, release, unsupported_reason
from schemas.request import REQUEST_MODELS

ROOT = Path(__file__).resolve().parents[2]


def test_readme_method_table_is_generated_from_the_table() -> None:
    assert readme_table() == markdown_table(), (
        "docs/methods.md's method table drifted: run `python -m handlers.contract.methods_doc`"
    )


def test_the_request_models_are_the_tables() -> None:
    assert list(REQUEST_MODELS) == list(METHODS)
    for name, request in REQUEST_MODELS.items():
        assert request.model_fields["method"].annotation.__args__ == (name,)


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.12.0", (1, 12, 0)),
        ("1.10", (1, 10)),
        ("1.13.0rc1", (1, 13, 0)),
        ("1.12.0.dev0", (1, 12, 0)),
        ("2", (2,)),
    ],
)
def test_release_reads_the_leading_integers(version: str, expected: tuple[int, ...]) -> None:
    assert release(version) == expected


@pytest.mark.parametrize(
    ("version", "runs"),
    [
        ("1.9.9", False),
        ("1.10", True),
        ("1.10.0", True),
        ("1.12.0", True),
        ("1.12.9", True),
        ("1.13.0", False),
        ("1.13.0rc1", False),
        ("1.16.0", False),
        ("2.0", False),
    ],
)
def test_ppo_runs_on_trl_1_10_to_1_12_only(version: str, runs: bool) -> None:
    reason = unsupported_reason("ppo", version)
    assert (reason is None) == runs, reason
    if not runs:
        assert "needs trl>=1.10,<1.13" in reason and f"this host has trl {version}" in reason


def test_the_other_methods_run_on_any_trl_and_none_without_it() -> None:
    assert all(unsupported_reason(name, "1.16.0") is None for name in METHODS if name != "ppo")
    assert unsupported_reason("sft", None) == "trl is not installed on this host"


def test_the_trainer_named_in_events_comes_from_the_table() -> None:
    assert METHODS["sft"].trained_by == "trl.SFTTrainer/trl.SFTConfig"
    assert METHODS["ppo"].trained_by == "trl.experimental.ppo.PPOTrainer/trl.experimental.ppo.PPOConfig"


def test_the_experimental_flag_and_schema_mark_come_from_the_table() -> None:
    for name, method in METHODS.items():
        marked = REQUEST_MODELS[name].model_json_schema().get("x-adapterd-experimental", False)
        assert marked == (method.status == "experimental"), name


def _defines_train(path: Path) -> bool:
    return any(isinstance(node, ast.FunctionDef) and node.name == "train" for node in ast.parse(path.read_text()).body)


def _imported_names(path: Path) -> set[str]:
    """`module.Name` for every `from module import Name` at the top of a file."""
    return {
        f"{node.module}.{alias.name}"
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_method_has_a_handler_an_example_and_an_end_to_end_test(name: str) -> None:
    method = METHODS[name]
    handler = ROOT / f"{method.module.replace('.', '/')}.py"
    assert handler.is_file() and _defines_train(handler), f"{name}: no {handler.relative_to(ROOT)} with a train()"
    # the handler trains with the TRL classes the table names (and events report)
    assert {method.trainer, method.config} <= _imported_names(handler), (
        f"{name}: handler does not import {method.trained_by}"
    )
    assert (ROOT / "schemas" / "examples" / f"{name}.json").is_file(), f"{name}: no schemas/examples/{name}.json"
    test = ROOT / "tests" / "handlers" / f"test_{name}.py"
    assert test.is_file() and f'"{name}"' in test.read_text(), f"{name}: no tests/handlers/test_{name}.py that runs it"


def test_every_handler_module_is_in_the_table() -> None:
    methods = ROOT / "handlers" / "methods"
    handlers = {
        ".".join(path.relative_to(methods).with_suffix("").parts)
        for path in methods.rglob("*.py")
        if _defines_train(path)
    }
    assert handlers == {method.handler for method in METHODS.values()}


@pytest.mark.parametrize("name", sorted(METHODS))
def test_an_experimental_method_and_only_one_is_in_the_experimental_folder(name: str) -> None:
    """As TRL keeps its own apart (`trl.experimental`): where a handler is says what the table says of it."""
    method = METHODS[name]
    assert (method.handler.split(".")[0] == "experimental") == (method.status == "experimental"), name
    assert (method.status == "experimental") == method.trainer.startswith("trl.experimental."), name
