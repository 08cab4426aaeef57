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
import yaml
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.cli.convert.trl_datasets import MIXTURE_DEFAULTS, SCRIPT_DEFAULTS
from daemon.cli.convert.trl_model import MODEL_CLI_DEFAULTS
from daemon.cli.convert.trl_renames import REMOVED, RENAMES
from daemon.cli.convert.trl_rewards import REWARD_DEFAULTS, REWARD_METHODS
from schemas import Rejection, decode_request
from schemas.contract_rules import MODEL_CONFIG_PATHS, refusal
from schemas.generated import load_contract
from tests.helpers import said

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
    return result.exit_code, request, said(result.stderr)


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
    assert request["dataset"] == {
        "id": "trl-lib/Capybara",
        "eval_split": "validation",
    }  # trl evaluates on dataset_test_split
    assert request["peft"] == {"r": 32, "lora_alpha": 16, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj"]}
    assert request["training"] == {
        "learning_rate": 2e-4,
        "num_train_epochs": 1.0,
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 8,
        "bf16": True,
        "optim": "adamw_torch",
        "lr_scheduler_type": "cosine_with_min_lr",
        "lr_scheduler_kwargs": {"min_lr_rate": 0.1},
        "warmup_steps": 0.03,
        "logging_steps": 5.0,
        "eval_strategy": "steps",
        "eval_steps": 100.0,
        "report_to": ["wandb"],
    }  # gradient_checkpointing: true is SFTConfig's default, so the job gets it without the key
    assert CONTRACT["sft"]["training_defaults"]["gradient_checkpointing"] is True
    assert request["sft"] == {"packing": True, "max_length": 2048}
    assert request["output"] == {"repo_id": "my-org/qwen-sft-lora"}

    assert f"output_dir: {refused('training', 'output_dir').split(': ', 1)[1]}" in stderr
    assert refused("training", "push_to_hub") in stderr
    assert refused("training", "hub_token") in stderr
    assert [line.split(":")[0] for line in stderr] == [
        "output_dir",
        "push_to_hub",
        "hub_token",
    ]  # save_strategy, hub_strategy: defaults
    assert "hf_abcdefghijklmnopqrstuvwxyz" not in "\n".join(stderr)


def test_a_trl_dpo_config_converts_with_its_method_from_the_file_name(tmp_path: Path) -> None:
    code, request, stderr = convert(tmp_path, "dpo.yaml", DPO_YAML, "--output-repo", "my-org/qwen-dpo")
    assert code == 0, stderr
    assert request is not None and request["method"] == "dpo" and request["request_id"].startswith("dpo-")
    assert request["dpo"] == {"beta": 0.2, "loss_type": ["sigmoid", "sft"], "max_length": 512}
    assert request["training"] == {"learning_rate": 5e-7}
    # QLoRA as trl's CLI does it: float32 base, PEFT's choice of modules, no nested quantization.
    assert request["model"] == {
        "id": "Qwen/Qwen2-0.5B-Instruct",
        "dtype": "float32",
        "quantization": "4bit",
        "use_bnb_nested_quant": False,
    }
    assert request["peft"] == {"target_modules": None}
    assert request["output"] == {"repo_id": "my-org/qwen-dpo"}
    assert "dataset_test_split" not in json.dumps(request) and "eval_split" not in request["dataset"]
    keys = [line.split(":")[0] for line in stderr]
    assert keys == ["ignore_bias_buffers", "output_dir", "env"]
    assert "0123456789abcdef" not in "\n".join(stderr)


def test_without_use_peft_the_request_is_a_full_fine_tune_and_lora_keys_are_named_unused(tmp_path: Path) -> None:
    text = (
        "model_name_or_path: Qwen/Qwen2-0.5B\ndataset_name: trl-lib/Capybara\nlora_r: 8\nlora_alpha: "
        "32\nhub_model_id: org/full\n"
    )
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["peft"] is None
    assert stderr == [
        "lora_r: unused: use_peft is not set, so trl trains the whole model (peft: null)"
    ]  # lora_alpha 32 is the default


def test_a_key_unknown_to_trl_is_named(tmp_path: Path) -> None:
    text = SFT_YAML + "max_sequence_len: 1024\nbeta: 0.1\n"
    code, request, stderr = convert(tmp_path, "sft.yaml", text, "--request-id", "x")
    assert code == 0 and request is not None
    version = f"trl {CONTRACT['sft']['version']}"
    for key in ("max_sequence_len", "beta"):  # no trl name at any release; a DPOConfig field
        assert any(line.startswith(f"{key}: unknown to {version}'s SFTConfig") for line in stderr), stderr
        assert key not in json.dumps(request)


@pytest.mark.parametrize(
    ("typo", "meant", "path"),
    [
        ("learning_rat", "learning_rate", "training.learning_rate"),
        ("per_device_train_batch_siz", "per_device_train_batch_size", "training.per_device_train_batch_size"),
        ("dataset_text_fild", "dataset_text_field", "sft.dataset_text_field"),
    ],
)
def test_a_typo_of_a_known_key_is_an_error_naming_the_key_it_meant(
    tmp_path: Path, typo: str, meant: str, path: str
) -> None:
    code, request, stderr = convert(tmp_path, "sft.yaml", SFT_YAML + f"{typo}: 7\n", "--request-id", "x")
    assert code == 1 and request is None  # not a request that trains with the default the file meant to change
    assert any(
        line.strip() == f"{path}: the file's key {typo!r} is unknown to trl {CONTRACT['sft']['version']}'s SFTConfig; "
        f"did you mean {meant!r}?"
        for line in stderr
    ), stderr
    # Its line in the ledger says the same, not that it was read to decide other keys (issue 49).
    [said] = [line for line in stderr if line.startswith(f"{typo}:")]
    assert (
        said == f"{typo}: not carried: unknown to trl {CONTRACT['sft']['version']}'s SFTConfig; did you mean {meant!r}?"
    ), stderr
    assert not any("decides how the keys beside it" in line for line in stderr), stderr


# An SFT recipe as the alignment-handbook wrote them for trl 0.x and transformers 4.x.
OLD_SFT_YAML = """\
model_name_or_path: Qwen/Qwen2.5-0.5B
torch_dtype: bfloat16
dataset_name: trl-lib/Capybara
evaluation_strategy: steps
eval_steps: 50
warmup_ratio: 0.1
max_seq_length: 512
use_liger: true
overwrite_output_dir: true
hub_model_id: my-org/old-recipe
"""


def test_keys_trl_and_transformers_renamed_carry_under_their_new_names_each_said_with_its_release(
    tmp_path: Path,
) -> None:
    code, request, stderr = convert(tmp_path, "sft.yaml", OLD_SFT_YAML, "--request-id", "old-recipe")
    assert code == 0, stderr
    assert request is not None and not isinstance(decode_request(json.dumps(request).encode()), Rejection)
    # The recipe's bfloat16, not trl's float32 default: the dtype is the training's, and it is kept.
    assert request["model"] == {"id": "Qwen/Qwen2.5-0.5B", "dtype": "bfloat16"}
    assert request["training"] == {
        "eval_strategy": "steps",
        "eval_steps": 50.0,
        "warmup_steps": 0.1,
        "use_liger_kernel": True,
    }
    assert request["sft"] == {"max_length": 512}
    said = {line.split(":")[0]: line for line in stderr}
    assert said["torch_dtype"].startswith("torch_dtype: carried as dtype (renamed in trl 0.27.0")
    assert said["evaluation_strategy"].startswith(
        "evaluation_strategy: carried as eval_strategy (renamed in transformers 4.51.0"
    )
    assert said["warmup_ratio"].startswith("warmup_ratio: carried as warmup_steps (renamed in transformers 5.15.0")
    assert said["max_seq_length"].startswith("max_seq_length: carried as max_length (renamed in trl 0.20.0")
    assert said["use_liger"].startswith("use_liger: carried as use_liger_kernel (renamed in trl 0.18.0")
    assert (
        said["overwrite_output_dir"]
        == "overwrite_output_dir: removed in transformers 5.0.0: nothing replaced it; each job "
        "writes to a fresh folder of its own"
    )
    assert set(said) == {
        "torch_dtype",
        "evaluation_strategy",
        "warmup_ratio",
        "max_seq_length",
        "use_liger",
        "overwrite_output_dir",
    }


def test_an_old_name_beside_its_new_one_is_said_once_or_refused_when_they_disagree(tmp_path: Path) -> None:
    agree = OLD_SFT_YAML + "dtype: bfloat16\n"
    code, request, stderr = convert(tmp_path, "sft.yaml", agree)
    assert code == 0 and request is not None and request["model"]["dtype"] == "bfloat16"
    assert "torch_dtype: already said by dtype, its name since trl 0.27.0" in stderr

    code, request, stderr = convert(tmp_path, "sft.yaml", OLD_SFT_YAML + "dtype: float16\n")
    assert code == 1 and request is None
    assert any(
        line.strip().startswith(
            "model.dtype: torch_dtype (its name before trl 0.27.0) and dtype are both set, to different values"
        )
        for line in stderr
    ), stderr


def test_a_warmup_ratio_that_is_no_fraction_under_one_is_refused_not_turned_into_one_step(tmp_path: Path) -> None:
    # transformers 5 reads warmup_steps 1.0 as one step, where warmup_ratio 1.0 meant every step.
    code, request, stderr = convert(
        tmp_path, "sft.yaml", OLD_SFT_YAML.replace("warmup_ratio: 0.1", "warmup_ratio: 1.0")
    )
    assert code == 1 and request is None
    assert any(
        line.strip().startswith("training.warmup_steps: warmup_ratio 1.0 has no warmup_steps") for line in stderr
    ), stderr


def test_a_removed_key_is_named_with_the_release_and_what_replaced_it_for_its_method_only(tmp_path: Path) -> None:
    grpo = (
        "model_name_or_path: m/m\ndataset_name: d/d\nreward_funcs: [think_format_reward]\nmax_prompt_length: "
        "256\nuse_liger_loss: true\n"
    )
    code, request, stderr = convert(tmp_path, "grpo.yaml", grpo, "--output-repo", "my-org/grpo")
    assert code == 0, stderr
    assert request is not None and request["training"]["use_liger_kernel"] is True
    assert any(
        line.startswith("max_prompt_length: removed in trl 0.28.0: GRPO no longer truncates prompts") for line in stderr
    ), stderr
    # KTO's history of max_prompt_length is not in the reviewed table: it is named unknown, not guessed at.
    code, request, stderr = convert(
        tmp_path,
        "kto.yaml",
        "model_name_or_path: m/m\ndataset_name: d/d\nmax_prompt_length: 256\n",
        "--output-repo",
        "o/o",
    )
    assert any(line.startswith("max_prompt_length: unknown to trl") for line in stderr), stderr


def test_the_renames_table_names_only_keys_todays_trl_takes_and_none_it_still_takes_under_the_old_name() -> None:
    """Held to the locked contract here; to trl's own parsers by the slow test below."""
    for row in RENAMES:
        for method in row.methods & set(CONTRACT):
            known = converter_keys(method)
            assert row.renamed.new in known and row.renamed.old not in known, (row, method)
    for removed in REMOVED:
        for method in removed.methods & set(CONTRACT):
            assert removed.key not in converter_keys(method), (removed, method)


def converter_keys(method: str) -> set[str]:
    listed = (
        MODEL_CLI_DEFAULTS | SCRIPT_DEFAULTS | MIXTURE_DEFAULTS | (REWARD_DEFAULTS if method in REWARD_METHODS else {})
    )
    return (
        set(CONTRACT["training"]["fields"])
        | set(CONTRACT[method]["fields"])
        | set(CONTRACT["model"]["fields"])
        | set(listed)
    )


def test_a_config_that_makes_an_invalid_request_exits_1_naming_the_field(tmp_path: Path) -> None:
    text = SFT_YAML.replace("learning_rate: 2e-4", "learning_rate: -1").replace(
        "optim: adamw_torch", "optim: sgd_with_wings"
    )
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 1 and request is None
    assert any(
        line.strip().startswith("training.learning_rate: ") and "(from learning_rate)" in line for line in stderr
    ), stderr
    assert any(line.strip().startswith("training.optim: ") for line in stderr), stderr


def test_without_an_output_repo_it_exits_1_saying_how_to_give_one(tmp_path: Path) -> None:
    code, request, stderr = convert(
        tmp_path, "sft.yaml", SFT_YAML.replace("hub_model_id: my-org/qwen-sft-lora", "hub_model_id: qwen-sft")
    )
    assert code == 1 and request is None
    assert any(
        "output.repo_id: hub_model_id 'qwen-sft' has no namespace; give --output-repo" in line for line in stderr
    ), stderr


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
    assert request is not None and request["dataset"] == {
        "mixture": [
            {"id": "trl-lib/Capybara", "split": "train", "proportion": 1.0},
            {"url": "s3://ml-data/chat/*.jsonl", "format": "json", "proportion": 3.0},
        ],
        "streaming": True,
    }
    assert [line.split(":")[0] for line in stderr] == [
        "datasets",
        "datasets.1.columns",
        "test_split_size",
        "eval_strategy",
    ]
    assert (
        "carried, but each entry's fraction of its dataset becomes its share" in stderr[0]
    )  # a change of meaning, said


def test_a_mixture_without_fractions_exits_1(tmp_path: Path) -> None:
    text = "model_name_or_path: m/m\ndatasets:\n  - path: a/b\n  - path: c/d\nhub_model_id: org/x\n"
    code, _, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 1
    assert any(
        line.strip().startswith("dataset.mixture: datasets: give every entry a `fraction`") for line in stderr
    ), stderr


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
        "functions": [{"name": "accuracy", "weight": 1.0}, {"name": "think_format", "weight": 2.0}],
        "model": {"id": "my-org/reward-model", "weight": 0.5},
    }
    assert stderr == [
        "reward_funcs.0: accuracy_reward: carried as accuracy",
        "reward_funcs.1: think_format_reward: carried as think_format",
    ]


@pytest.mark.parametrize(
    ("name", "text", "args", "says"),
    [
        ("config.yaml", "model_name_or_path: a/b\n", (), "does not name a method; give --method"),
        ("sft.yaml", "model_name_or_path: a/b\n", ("--method", "pretrain"), "unknown method 'pretrain'"),
        ("sft.yaml", "- just\n- a list\n", (), "one YAML mapping"),
        ("sft.yaml", "model_name_or_path: a/b\n", ("--request-id", "has space"), "not a request id"),
        ("sft.yaml", "model_name_or_path: a/b\n", ("--output-repo", "no-namespace"), "--output-repo"),
    ],
)
def test_usage_errors_exit_2(tmp_path: Path, name: str, text: str, args: tuple[str, ...], says: str) -> None:
    code, request, stderr = convert(tmp_path, name, text, *args)
    assert code == 2 and request is None
    assert says in "\n".join(stderr)


def test_the_command_line_prints_the_request_on_stdout_and_the_dropped_keys_on_stderr(tmp_path: Path) -> None:
    path = tmp_path / "sft.yaml"
    path.write_text(SFT_YAML)
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "convert", "trl-config", str(path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["method"] == "sft"
    ledger = result.stderr.splitlines()
    # A line a key, in the file's order: each key said once, where it went.
    assert [line.split(":")[0] for line in ledger] == list(yaml.safe_load(SFT_YAML)), ledger
    assert "model_name_or_path: carried to model.id" in ledger
    assert any(line.startswith("output_dir: set by the daemon") for line in ledger)
    assert any(line.startswith("save_strategy: left at TRL's default") for line in ledger)  # not gone without a word


def test_the_model_config_keys_said_elsewhere_have_their_trl_defaults_here() -> None:
    assert set(MODEL_CLI_DEFAULTS) == set(MODEL_CONFIG_PATHS)


@pytest.mark.slow  # imports TRL and torch: half a minute on 2 cores
@pytest.mark.parametrize("method", ["sft", "dpo", "kto", "reward", "grpo", "rloo"])
def test_the_keys_the_converter_knows_are_the_keys_trls_own_parser_takes(method: str) -> None:
    """The contract's fields and the arguments listed in daemon/cli/convert/trl_model.py and beside it, against the
    parser of `trl <method>` (trl/scripts/<method>.py make_parser), with the same defaults."""
    parser = importlib.import_module(f"trl.scripts.{method}").make_parser()
    defaults = {action.dest: action.default for action in parser._actions if action.dest != "help"}
    listed = (
        MODEL_CLI_DEFAULTS | SCRIPT_DEFAULTS | MIXTURE_DEFAULTS | (REWARD_DEFAULTS if method in REWARD_METHODS else {})
    )
    assert set(defaults) == converter_keys(method)
    assert {key: defaults[key] for key in listed} == listed
    # The renames and removals of daemon/cli/convert/trl_renames.py, against the parser itself.
    for row in RENAMES:
        if method in row.methods:
            assert row.renamed.new in defaults and row.renamed.old not in defaults, row
    assert not {removed.key for removed in REMOVED if method in removed.methods} & set(defaults)


def test_a_mixtures_test_split_size_carves_the_eval_set_it_evaluates_on(tmp_path: Path) -> None:
    text = """\
model_name_or_path: Qwen/Qwen2-0.5B
datasets:
  - path: trl-lib/Capybara
    split: train
    fraction: 1
  - path: trl-lib/tldr
    fraction: 1
test_split_size: 0.1
eval_strategy: steps
eval_steps: 50
hub_model_id: org/mix
"""
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    assert (
        request is not None and request["dataset"]["test_split_size"] == 0.1 and len(request["dataset"]["mixture"]) == 2
    )
    assert request["training"]["eval_strategy"] == "steps"  # there is an eval set: trl's evaluation is carried
    assert not [line for line in stderr if line.startswith(("test_split_size", "eval_strategy"))], stderr


def test_a_handbook_mixture_gets_what_every_dataset_gets_streaming_the_prompt_column_and_the_eval_check(
    tmp_path: Path,
) -> None:
    """The handbook's mixture picks the sources; what follows is the same as for any dataset: its
    dataset_streaming streams, ignore_bias_buffers is said, open-r1's prompt column is renamed, and
    an eval_strategy with no eval set carried is left with its reason."""
    text = """model_name_or_path: Qwen/Qwen2-0.5B
dataset_mixture:
  datasets:
    - id: trl-lib/Capybara
      split: train
      weight: 0.5
    - id: trl-lib/tldr
      split: train
      weight: 0.5
dataset_streaming: true
ignore_bias_buffers: true
dataset_prompt_column: problem
eval_strategy: steps
max_steps: 10
hub_model_id: org/mix
"""
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["dataset"]["streaming"] is True and len(request["dataset"]["mixture"]) == 2
    assert all(part["columns"] == {"problem": "prompt"} for part in request["dataset"]["mixture"])
    said = {line.split(":")[0]: line for line in stderr}
    assert "a DDP workaround" in said["ignore_bias_buffers"]
    assert "no eval set was carried" in said["eval_strategy"] and "eval_strategy" not in request["training"]


def test_a_count_of_rows_carves_that_many_and_a_float_is_never_read_as_a_count() -> None:
    from schemas.dataset import DatasetSpec

    assert DatasetSpec.model_validate({"id": "a/b", "test_split_size": 1000}).test_split_size == 1000
    for value in (1e6, 1.0, 0, -3, True):
        with pytest.raises(ValueError):
            DatasetSpec.model_validate({"id": "a/b", "test_split_size": value})


def test_a_value_trl_renamed_is_read_as_todays_and_said(tmp_path: Path) -> None:
    text = (
        "model_name_or_path: Qwen/Qwen2-0.5B\ndataset_name: trl-lib/Capybara\npacking: true\npacking_strategy: "
        "ffd\nhub_model_id: org/packed\n"
    )
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    # 'bfd' is today's default, which the request leaves unsaid; 'ffd' itself would be refused by the schema.
    assert request is not None and request["sft"] == {"packing": True}
    assert "packing_strategy: carried, but its value 'ffd' is 'bfd' since trl 0.20.0" in "\n".join(stderr)


def test_every_renamed_value_is_one_todays_trl_takes_and_its_old_one_is_not() -> None:
    from daemon.cli.convert.trl_renames import RENAMED_VALUES

    contract = json.loads(
        (Path(__file__).parents[3] / "schemas" / "trl_contract.json").read_text()
    )  # read from the locked TRL
    for row in RENAMED_VALUES:
        for method in row.methods:
            choices = contract[method]["fields"][row.key]["choices"]
            assert row.new in choices and row.old not in choices, (row, choices)


def test_a_steps_key_trl_ignores_under_its_strategy_is_left_out_with_a_word(tmp_path: Path) -> None:
    """The issue's Qwen2.5-VL recipe: a leftover `save_steps: 1` under `save_strategy: epoch` would
    have become a checkpoint every step."""
    text = (
        "model_name_or_path: Qwen/Qwen2-0.5B\ndataset_name: trl-lib/Capybara\nsave_strategy: epoch\nsave_steps: 1\n"
        "evaluation_strategy: 'no'\neval_steps: 5\nlogging_strategy: epoch\nlogging_steps: 3\nhub_model_id: org/x\n"
    )
    code, request, stderr = convert(tmp_path, "sft.yaml", text)
    assert code == 0, stderr
    assert request is not None and not {"save_steps", "eval_steps", "logging_steps"} & set(request["training"])
    said = {line.split(":")[0]: line for line in stderr}
    assert said["save_steps"].startswith(
        "save_steps: ignored by TRL under save_strategy 'epoch'; the daemon saves every training.save_steps"
    )
    assert (
        said["eval_steps"] == "eval_steps: ignored by TRL under eval_strategy 'no'"
    )  # read under evaluation_strategy's new name
    assert said["logging_steps"] == "logging_steps: ignored by TRL under logging_strategy 'epoch'"
    kept = (
        "model_name_or_path: Qwen/Qwen2-0.5B\ndataset_name: trl-lib/Capybara\nsave_steps: 7\nlogging_steps: "
        "3\nhub_model_id: org/x\n"
    )
    code, request, stderr = convert(tmp_path, "sft.yaml", kept)  # under the default strategies, 'steps', both are read
    assert (
        request is not None and request["training"]["save_steps"] == 7 and request["training"]["logging_steps"] == 3
    ), stderr


def test_a_grpo_recipe_without_rewards_names_open_r1s_defaults_and_the_closest_shipped(tmp_path: Path) -> None:
    code, request, stderr = convert(
        tmp_path, "grpo.yaml", "model_name_or_path: m/m\ndataset_name: d/d\n", "--output-repo", "o/o"
    )
    assert code == 1 and request is None
    [line] = [line.strip() for line in stderr if line.strip().startswith("rewards:")]
    assert (
        "open-r1's script would use its default, accuracy, format, tag_count (reward_funcs: [accuracy, "
        "format, tag_count] converts them)" in line
    )
    assert "Field required" not in "\n".join(stderr)
    code, _, stderr = convert(
        tmp_path, "rloo.yaml", "model_name_or_path: m/m\ndataset_name: d/d\n", "--output-repo", "o/o"
    )
    assert code == 1 and any("names no reward" in line and "open-r1" not in line for line in stderr), stderr


def test_with_a_hosts_settings_the_request_is_judged_as_its_daemon_would(tmp_path: Path) -> None:
    text = SFT_YAML + "report_to: wandb\n"
    host = tmp_path / "host.toml"
    host.write_text("allowed_report_to = []\n")
    code, request, _ = convert(tmp_path, "sft.yaml", text)
    assert (
        code == 0 and request is not None and request["training"]["report_to"] == ["wandb"]
    )  # the converter carries it
    code, request, stderr = convert(tmp_path, "sft.yaml", text, "--config", str(host))
    assert code == 1 and request is None  # this host would refuse it: nothing printed to submit
    assert any(line.strip().startswith("training.report_to: wandb is not allowed on this host") for line in stderr), (
        stderr
    )


GRPO_HEAD = "model_name_or_path: m/m\ndataset_name: d/d\nhub_model_id: o/o\n"


def test_trls_script_rewards_carry_as_its_script_builds_them(tmp_path: Path) -> None:
    text = (
        GRPO_HEAD
        + "reward_funcs: [reasoning_accuracy_reward, get_soft_overlong_punishment, trl.rewards.think_format_reward]\n"
    )
    code, request, stderr = convert(tmp_path, "grpo.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["rewards"]["functions"] == [
        {"name": "reasoning_accuracy"},
        {"name": "soft_overlong_punishment", "max_completion_len": 1280, "soft_punish_cache": 256},
        {"name": "think_format"},
    ]
    assert (
        "reward_funcs.1: get_soft_overlong_punishment: carried as soft_overlong_punishment (trl's script builds "
        "it with max_completion_len 1280" in stderr[1]
    )


def test_open_r1s_rewards_carry_with_their_parameters_and_those_without_a_counterpart_refuse(tmp_path: Path) -> None:
    text = GRPO_HEAD + (
        "reward_funcs: [soft_overlong_punishment, code_format, tag_count]\nreward_weights: [0.5, 1.0, 2.0]\n"
        "max_completion_len: 2048\nsoft_punish_cache: 512\ncode_language: cpp\ncosine_max_len: 300\n"
    )
    code, request, stderr = convert(tmp_path, "grpo.yaml", text)
    assert code == 0, stderr
    assert request is not None and request["rewards"]["functions"] == [
        {"name": "soft_overlong_punishment", "max_completion_len": 2048, "soft_punish_cache": 512, "weight": 0.5},
        {
            "name": "regex_match",
            "pattern": "(?sm)\\A<think>\\n.*?\\n</think>\\n<answer>\\n.*?```cpp.*?```.*?\\n</answer>$",
            "weight": 1.0,
        },
        {"name": "tag_count", "weight": 2.0},
    ]
    said = {line.split(":")[0]: line for line in stderr}
    assert "a row's `language` column" in said["reward_funcs.1"]  # what the pattern cannot do, said
    assert said["cosine_max_len"] == "cosine_max_len: read only by an open-r1 reward the file does not name"
    for refused, why in [
        ("cosine", "counts tokens"),
        ("repetition_penalty", "word n-grams"),
        ("code", "never runs a completion's code"),
        ("length", "Kimi"),
        ("reasoning_steps", "step markers"),
    ]:
        code, request, stderr = convert(
            tmp_path, "grpo.yaml", GRPO_HEAD + f"reward_funcs: [accuracy, {refused}]\ncosine_max_len: 300\n"
        )
        said = {line.split(":")[0]: line for line in stderr}
        assert code == 1 and request is None, stderr
        assert f"reward_funcs.1: {refused}: no" in said["reward_funcs.1"] and why in said["reward_funcs.1"]
        assert any(line.strip().startswith(f"rewards: reward_funcs.1: {refused}: no") for line in stderr), stderr
        if refused == "cosine":
            assert said["cosine_max_len"] == "cosine_max_len: read by open-r1's cosine reward, which is not carried"


def test_an_open_r1_recipe_without_reward_funcs_carries_its_scripts_default(tmp_path: Path) -> None:
    code, request, stderr = convert(tmp_path, "grpo.yaml", GRPO_HEAD + "dataset_prompt_column: problem\n")
    assert code == 0, stderr
    assert request is not None and [f["name"] for f in request["rewards"]["functions"]] == [
        "accuracy",
        "regex_match",
        "tag_count",
    ]
    assert [line.split(":")[0] for line in stderr if line.startswith("reward_funcs")] == [
        "reward_funcs.0",
        "reward_funcs.1",
        "reward_funcs.2",
    ]
    assert all("open-r1's default" in line for line in stderr if line.startswith("reward_funcs")), stderr


@pytest.mark.parametrize(
    "text",
    [
        "<think>\nwhy\n</think>\n<answer>\n42\n</answer>",
        "<think>\nwhy\n</think>\n<answer>\n42\n</answer>\ntrailing",
        "x<think>\nwhy\n</think>\n<answer>\n42\n</answer>",
        "<think>\na\nb\n</think>\n<answer>\nc\n</answer>\n",
        "<think>\n</think>\n<answer>\n42\n</answer>",
        "<think>\nwhy\n</think><answer>\n42\n</answer>",
        "",
    ],
)
def test_open_r1s_format_pattern_in_re2_matches_what_open_r1s_matches(text: str) -> None:
    import re

    from daemon.cli.convert.open_r1_rewards import FORMAT_PATTERN
    from schemas.regex import compile_pattern

    open_r1 = (
        re.match(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", text, re.DOTALL | re.MULTILINE) is not None
    )
    assert (compile_pattern(FORMAT_PATTERN).search(text) is not None) == open_r1
