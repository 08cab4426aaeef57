"""The `peft` block's patterns matched by adapterd with RE2 before PEFT sees them (issue 37): PEFT
gets the module names, never a pattern its Python `re` could backtrack on for hours; and intake
refuses a pattern RE2 or Python's re cannot compile, naming the field. No torch: module names only."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest

from handlers.protocol import JobFailed
from handlers.toolkit.lora_patterns import resolved
from schemas import Rejection, decode_request
from tests.helpers import sft_request

MODULES = [
    "",
    "model",
    "model.layers.0",
    "model.layers.0.self_attn.q_proj",
    "model.layers.0.self_attn.v_proj",
    "model.layers.0.mlp.up_proj",
    "model.layers.1.self_attn.q_proj",
    "lm_head",
]
BACKTRACKS = "([a-z._0-9]+)+Z"  # Python's re: 16 s on a 28-character name, doubling per character


def test_a_string_target_modules_becomes_the_names_it_fully_matches() -> None:
    fields = resolved({"target_modules": r".*\.(q|v)_proj", "exclude_modules": r".*layers\.1\..*"}, MODULES)
    assert fields["target_modules"] == [name for name in MODULES if re.fullmatch(r".*\.(q|v)_proj", name)]
    assert fields["exclude_modules"] == ["model.layers.1.self_attn.q_proj"]


def test_a_catastrophic_pattern_is_matched_in_linear_time_and_never_reaches_peft() -> None:
    names = MODULES + ["model.layers.0.self_attn.abcdefghijklmnopqrstuvwxyz_q_proj_a" * 4]
    started = time.perf_counter()
    with pytest.raises(JobFailed, match="matches no module"):
        resolved({"target_modules": BACKTRACKS}, names)
    assert time.perf_counter() - started < 1.0


def test_rank_pattern_keys_become_escaped_module_names_first_key_winning() -> None:
    fields = resolved({"rank_pattern": {"q_proj": 8, ".*proj": 2}, "alpha_pattern": {"nothing": 1}}, MODULES)
    assert fields["rank_pattern"] == {
        re.escape("model.layers.0.self_attn.q_proj"): 8,
        re.escape("model.layers.0.self_attn.v_proj"): 2,
        re.escape("model.layers.0.mlp.up_proj"): 2,
        re.escape("model.layers.1.self_attn.q_proj"): 8,
    }
    assert fields["alpha_pattern"] == {}


def test_lists_and_all_linear_are_left_as_they_are() -> None:
    fields: dict[str, Any] = {"target_modules": "all-linear", "exclude_modules": ["lm_head"]}
    assert resolved(fields, MODULES) == fields


@pytest.mark.parametrize(
    ("peft", "path"),
    [
        ({"target_modules": "(?<=a)b"}, "peft.target_modules"),
        ({"target_modules": "a{4294967296}"}, "peft.target_modules"),
        ({"exclude_modules": r"\pN"}, "peft.exclude_modules"),  # RE2 takes it; Python's re, which PEFT runs, does not
        ({"rank_pattern": {"(?=x)": 4}}, "peft.rank_pattern"),
        ({"alpha_pattern": {"(": 4}}, "peft.alpha_pattern"),
        ({"target_modules": "a" * 1001}, "peft.target_modules"),
    ],
)
def test_intake_refuses_a_pattern_that_does_not_compile_naming_the_field(peft: dict[str, Any], path: str) -> None:
    decoded = decode_request(json.dumps(sft_request("p", peft=peft)).encode())
    assert isinstance(decoded, Rejection) and [error.path for error in decoded.errors] == [path], decoded


@pytest.mark.parametrize("value", ["(?<=a)", ["q_proj", "(?<=a)"], [f"x{i}" for i in range(65)]])
def test_intake_refuses_an_optim_target_modules_pattern_that_does_not_compile(value: Any) -> None:
    decoded = decode_request(json.dumps(sft_request("p", training={"optim_target_modules": value})).encode())
    assert isinstance(decoded, Rejection) and [error.path for error in decoded.errors] == [
        "training.optim_target_modules"
    ]


# PEFT runs `re.match(rf"(?:^|.*?\.){layers_pattern}\.(?P<idx>\d+)\.", name)` on every module name:
# a pattern that compiles (RE2 and Python's re both take these) can still backtrack for seconds.
@pytest.mark.parametrize(
    "layers", ["([a-z._0-9]+)+Z", "(a|aa)+", ["layers", "h*"], "layers\\.", "", [f"l{i}" for i in range(65)]]
)
def test_layers_pattern_is_a_name_not_a_pattern(layers: Any) -> None:
    decoded = decode_request(
        json.dumps(sft_request("p", peft={"layers_pattern": layers, "layers_to_transform": [0]})).encode()
    )
    assert isinstance(decoded, Rejection) and [error.path for error in decoded.errors] == ["peft.layers_pattern"], (
        decoded
    )


@pytest.mark.parametrize("layers", ["layers", "h", "model.layers", ["layers", "blocks_2"]])
def test_layers_pattern_takes_the_names_peft_documents(layers: Any) -> None:
    decoded = decode_request(
        json.dumps(sft_request("p", peft={"layers_pattern": layers, "layers_to_transform": [0]})).encode()
    )
    assert not isinstance(decoded, Rejection), decoded


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sft", "kto"])
def test_a_job_with_a_pattern_trains_lora_on_the_modules_it_matches(
    method: str, tiny_model_dir: Any, tmp_path: Any
) -> None:
    from daemon.cli.demo.requests import ROWS
    from tests.helpers import example_request, run_handler

    peft = {"r": 4, "lora_alpha": 8, "target_modules": r".*\.(q_proj|v_proj)", "rank_pattern": {"q_proj": 2}}
    request = example_request(
        method, f"patterns-{method}", model={"id": str(tiny_model_dir)}, peft=peft, dataset={"rows": ROWS[method]}
    )
    done, _ = run_handler(request, tmp_path / method)
    assert not isinstance(done, JobFailed), done
    config = json.loads((tmp_path / method / "artifact" / "adapter_config.json").read_text())
    assert config["target_modules"] and all(name.endswith(("q_proj", "v_proj")) for name in config["target_modules"])
    assert config["rank_pattern"] and set(config["rank_pattern"].values()) == {2}


def test_intake_bounds_how_many_patterns_it_compiles() -> None:
    decoded = decode_request(
        json.dumps(sft_request("p", peft={"rank_pattern": {f"x{i}": 4 for i in range(65)}})).encode()
    )
    assert isinstance(decoded, Rejection) and [error.path for error in decoded.errors] == ["peft.rank_pattern"]
