"""`adapterd convert trl-config`: a `trl` CLI config file becomes a request, and every key it cannot
carry is named on stderr with the reason."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.convert.trl_config import MODEL_CLI_DEFAULTS
from daemon.convert.trl_datasets import MIXTURE_DEFAULTS, SCRIPT_DEFAULTS
from daemon.convert.trl_rewards import REWARD_DEFAULTS, REWARD_METHODS
from schemas import Rejection, decode_request
from schemas.contract_render import load_contract
from schemas.contract_rules import MODEL_CONFIG_PATHS, refusal

runner = CliRunner()
CONTRACT = load_contract()

SFT_YAML = """\
# trl sft --config sft.yaml
model_name_or_path: Qwen/Qwen2.5-0.5B-Instruct
dtype: bfloat16
attn_implementation: sdpa
dataset_name: trl-lib/Capybara
dataset_test_split: validation

use_peft: true
lora_r: 32
lora_alpha: 16
lora_target_modules: [q_proj, k_proj, v_proj, o_proj]

learning_rate: 2e-4
num_train_epochs: 1
packing: true
max_length: 2048
per_device_train_batch_size: 2
gradient_accumulation_steps: 8
gradient_checkpointing: true
bf16: true
optim: adamw_torch
lr_scheduler_type: cosine_with_min_lr
lr_scheduler_kwargs:
  min_lr_rate: 0.1
warmup_steps: 0.03
logging_steps: 5
eval_strategy: steps
eval_steps: 100
report_to: wandb
save_strategy: steps
output_dir: Qwen2.5-0.5B-SFT
push_to_hub: true
hub_model_id: my-org/qwen-sft-lora
hub_strategy: every_save
hub_token: hf_abcdefghijklmnopqrstuvwxyzABCDEF
"""

DPO_YAML = """\
model_name_or_path: Qwen/Qwen2-0.5B-Instruct
dataset_name: trl-lib/ultrafeedback_binarized
learning_rate: 5.0e-7
beta: 0.2
loss_type: [sigmoid, sft]
max_length: 512
use_peft: true
load_in_4bit: true
ignore_bias_buffers: true
output_dir: Qwen2-0.5B-DPO
env:
  WANDB_API_KEY: 0123456789abcdef0123456789abcdef01234567
"""


def convert(tmp_path: Path, name: str, text: str, *args: str) -> tuple[int, dict[str, Any] | None, list[str]]:
    """Exit code, the request printed on stdout (None when nothing was), and the lines of stderr."""
    path = tmp_path / name
    path.write_text(text)
    result = runner.invoke(app, ["convert", "trl-config", str(path), *args])
    request = json.loads(result.stdout) if result.stdout.strip() else None
    return result.exit_code, request, result.stderr.splitlines()


def refused(block: str, key: str) -> str:
    why = refusal(block, key)
    assert why is not None
    return why.message(key)


def test_a_trl_sft_config_converts_with_each_value_in_its_block(tmp_path: Path) -> None:
    code, request, stderr = convert(tmp_path, "sft.yaml", SFT_YAML, "--request-id", "qwen-sft-1")
    assert code == 0, stderr
    assert request is not None and not isinstance(decode_request(json.dumps(request).encode()), Rejection)
    assert (request["method"], request["request_id"]) == ("sft", "qwen-sft-1")
    assert request["model"] == {"id": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": "bfloat16", "attn_implementation": "sdpa"}
    assert request["dataset"] == {"id": "trl-lib/Capybara", "eval_split": "validation"}  # trl evaluates on dataset_test_split
    assert request["peft"] == {"r": 32, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    assert request["training"] == {
        "learning_rate": 2e-4, "num_train_epochs": 1.0, "per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
        "bf16": True, "optim": "adamw_torch", "lr_scheduler_type": "cosine_with_min_lr", "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "warmup_steps": 0.03, "logging_steps": 5.0, "eval_strategy": "steps", "eval_steps": 100.0, "report_to": ["wandb"],
    }  # gradient_checkpointing: true is SFTConfig's default, so the job gets it without the key
    assert CONTRACT["sft"]["training_defaults"]["gradient_checkpointing"] is True
    assert request["sft"] == {"packing": True, "max_length": 2048}
    assert request["output"] == {"repo_id": "my-org/qwen-sft-lora"}

    assert f"output_dir: {refused('training', 'output_dir').split(': ', 1)[1]}" in stderr
    assert refused("training", "push_to_hub") in stderr
    assert refused("training", "hub_token") in stderr
    assert [line.split(":")[0] for line in stderr] == ["output_dir", "push_to_hub", "hub_token"]  # save_strategy, hub_strategy: defaults
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in "\n".join(stderr)


def test_a_trl_dpo_config_converts_with_its_method_from_the_file_name(tmp_path: Path) -> None:
    code, request, stderr = convert(tmp_path, "dpo.yaml", DPO_YAML, "--output-repo", "my-org/qwen-dpo")
    assert code == 0, stderr
    assert request is not None and request["method"] == "dpo" and request["request_id"].startswith("dpo-")
    assert request["dpo"] == {"beta": 0.2, "loss_type": ["sigmoid", "sft"], "max_length": 512}
    assert request["training"] == {"learning_rate": 5e-7}
    # QLoRA as trl's CLI does it: float32 base, PEFT's choice of modules, no nested quantization.
    assert request["model"] == {"id": "Qwen/Qwen2-0.5B-Instruct", "dtype": "float32", "quantization": "4bit", "use_bnb_nested_quant": False}
    assert request["peft"] == {"target_modules": None}
    assert request["output"] == {"repo_id": "my-org/qwen-dpo"}
    assert "dataset_test_split" not in json.dumps(request) and "eval_split" not in request["dataset"]
    keys = [line.split(":")[0] for line in stderr]
    assert keys == ["ignore_bias_buffers", "output_dir", "env"]
    assert "0123456789abcdef" not in "\n".join(stderr)


def test_without_use_peft_the_request_is_a_full_fine_tune_and_lora_keys_are_named_unused(tmp_path: Path) -> None:
    text = "model_name_or_path: Qwen/Qwen2-0.5B\ndataset_name: trl-lib/Capybara\nlora_r: 8\nlora_alpha: 32\nhub_model_id: org/full\n"
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["peft"] is None
    assert stderr == ["lora_r: unused: use_peft is not set, so trl trains the whole model (peft: null)"]  # lora_alpha 32 is the default


def test_a_key_unknown_to_trl_is_named(tmp_path: Path) -> None:
    text = SFT_YAML + "max_seq_length: 1024\nbeta: 0.1\n"
    code, request, stderr = convert(tmp_path, "sft.yaml", text, "--request-id", "x")
    assert code == 0 and request is not None
    version = f"trl {CONTRACT['sft']['version']}"
    for key in ("max_seq_length", "beta"):  # SFTConfig's old name; a DPOConfig field
        assert any(line.startswith(f"{key}: unknown to {version}'s SFTConfig") for line in stderr), stderr
        assert key not in json.dumps(request)


def test_a_config_that_makes_an_invalid_request_exits_1_naming_the_field(tmp_path: Path) -> None:
    text = SFT_YAML.replace("learning_rate: 2e-4", "learning_rate: -1").replace("optim: adamw_torch", "optim: sgd_with_wings")
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 1 and request is None
    assert any(line.strip().startswith("training.learning_rate: ") and "(from learning_rate)" in line for line in stderr), stderr
    assert any(line.strip().startswith("training.optim: ") for line in stderr), stderr


def test_without_an_output_repo_it_exits_1_saying_how_to_give_one(tmp_path: Path) -> None:
    code, request, stderr = convert(tmp_path, "sft.yaml", SFT_YAML.replace("hub_model_id: my-org/qwen-sft-lora", "hub_model_id: qwen-sft"))
    assert code == 1 and request is None
    assert any("output.repo_id: hub_model_id 'qwen-sft' has no namespace; give --output-repo" in line for line in stderr), stderr


def test_a_datasets_mixture_with_fractions_becomes_a_mixture(tmp_path: Path) -> None:
    text = """\
model_name_or_path: Qwen/Qwen2-0.5B
datasets:
  - path: trl-lib/Capybara
    split: train
    fraction: 1
  - path: json
    data_files: s3://ml-data/chat/*.jsonl
    fraction: 3
    columns: [messages]
streaming: true
max_steps: 100
test_split_size: 0.1
eval_strategy: steps
hub_model_id: org/mix
"""
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["dataset"] == {"mixture": [
        {"id": "trl-lib/Capybara", "split": "train", "proportion": 1.0},
        {"url": "s3://ml-data/chat/*.jsonl", "format": "json", "proportion": 3.0},
    ], "streaming": True}
    assert [line.split(":")[0] for line in stderr] == ["datasets.1.columns", "test_split_size", "eval_strategy"]


def test_a_mixture_without_fractions_exits_1(tmp_path: Path) -> None:
    text = "model_name_or_path: m/m\ndatasets:\n  - path: a/b\n  - path: c/d\nhub_model_id: org/x\n"
    code, _, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 1
    assert any(line.strip().startswith("dataset.mixture: datasets: give every entry a `fraction`") for line in stderr), stderr


def test_grpo_rewards_take_the_functions_adapterd_ships_and_the_weights(tmp_path: Path) -> None:
    text = """\
model_name_or_path: Qwen/Qwen2-0.5B-Instruct
dataset_name: trl-lib/DeepMath-103K
reward_model_name_or_path: my-org/reward-model
reward_funcs: [accuracy_reward, think_format_reward]
reward_weights: [0.5, 1.0, 2.0]
hub_model_id: my-org/grpo
"""
    code, request, stderr = convert(tmp_path, "grpo.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["rewards"] == {
        "functions": [{"name": "think_format", "weight": 2.0}], "model": {"id": "my-org/reward-model", "weight": 0.5},
    }
    assert [line.split(":")[0] for line in stderr] == ["reward_funcs.0"]


@pytest.mark.parametrize(("name", "text", "args", "says"), [
    ("config.yaml", "model_name_or_path: a/b\n", (), "does not name a method; give --method"),
    ("sft.yaml", "model_name_or_path: a/b\n", ("--method", "pretrain"), "unknown method 'pretrain'"),
    ("sft.yaml", "- just\n- a list\n", (), "one YAML mapping"),
    ("sft.yaml", "model_name_or_path: a/b\n", ("--request-id", "has space"), "not a request id"),
    ("sft.yaml", "model_name_or_path: a/b\n", ("--output-repo", "no-namespace"), "--output-repo"),
])
def test_usage_errors_exit_2(tmp_path: Path, name: str, text: str, args: tuple[str, ...], says: str) -> None:
    code, request, stderr = convert(tmp_path, name, text, *args)
    assert code == 2 and request is None
    assert says in "\n".join(stderr)


def test_the_command_line_prints_the_request_on_stdout_and_the_dropped_keys_on_stderr(tmp_path: Path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text(SFT_YAML)
    result = subprocess.run([sys.executable, "-m", "daemon.cli.app", "convert", "trl-config", str(path)],
                            check=False, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["method"] == "sft"
    assert result.stderr.splitlines()[0].startswith("output_dir: set by the daemon")


def test_the_model_config_keys_said_elsewhere_have_their_trl_defaults_here() -> None:
    assert set(MODEL_CLI_DEFAULTS) == set(MODEL_CONFIG_PATHS)


@pytest.mark.slow  # imports TRL and torch: half a minute on 2 cores
@pytest.mark.parametrize("method", ["sft", "dpo", "kto", "reward", "grpo", "rloo"])
def test_the_keys_the_converter_knows_are_the_keys_trls_own_parser_takes(method: str) -> None:
    """The contract's fields and the script arguments listed in daemon/convert/trl_config.py, against the parser
    of `trl <method>` (trl/scripts/<method>.py make_parser), with the same defaults."""
    parser = importlib.import_module(f"trl.scripts.{method}").make_parser()
    defaults = {action.dest: action.default for action in parser._actions if action.dest != "help"}
    listed = MODEL_CLI_DEFAULTS | SCRIPT_DEFAULTS | MIXTURE_DEFAULTS | (REWARD_DEFAULTS if method in REWARD_METHODS else {})
    known = set(CONTRACT["training"]["fields"]) | set(CONTRACT[method]["fields"]) | set(CONTRACT["model"]["fields"]) | set(listed)
    assert set(defaults) == known
    assert {key: defaults[key] for key in listed} == listed
