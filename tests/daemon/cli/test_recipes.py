"""`adapterd convert trl-config` on recipes as their authors published them (tests/recipes, with
their sources in SOURCES.md): the alignment-handbook's and open-r1's. Each converts, or fails naming
the field and what to do; no key is unknown to the converter, and nothing that changes the training
goes unsaid."""

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from daemon.cli.app import app
from tests.helpers import said

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
runner = CliRunner()


def convert(name: str, method: str) -> tuple[int, dict[str, Any] | None, list[str]]:
    result = runner.invoke(
        app, ["convert", "trl-config", str(RECIPES / name), "--method", method, "--output-repo", "my-org/converted"]
    )
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else None, said(result.stderr)


def test_every_recipe_is_listed_with_its_source() -> None:
    sources = (RECIPES / "SOURCES.md").read_text()
    assert sorted(path.name for path in RECIPES.glob("*.yaml")) == sorted(
        line.split("|")[1].strip()
        for line in sources.splitlines()
        if line.startswith("| ") and ".yaml" in line.split("|")[1]
    )


EACH = [
    ("handbook-zephyr-7b-beta-dpo-qlora.yaml", "dpo"),
    ("handbook-zephyr-141b-orpo-full.yaml", "orpo"),
    ("open-r1-distill-7b-sft.yaml", "sft"),
    ("handbook-zephyr-7b-beta-sft-qlora.yaml", "sft"),
    ("handbook-smollm3-sft.yaml", "sft"),
    ("open-r1-qwen2.5-1.5b-grpo-demo.yaml", "grpo"),
    ("open-r1-deepseek-r1-distill-qwen-1.5b-grpo-demo.yaml", "grpo"),
    ("open-r1-qwen2.5-coder-7b-grpo-codeforces.yaml", "grpo"),
]


@pytest.mark.parametrize(("name", "method"), EACH)
def test_no_key_of_a_recipe_is_unknown_and_its_dtype_and_template_carry(name: str, method: str) -> None:
    recipe = yaml.safe_load((RECIPES / name).read_text())
    code, request, stderr = convert(name, method)
    assert not [line for line in stderr if "unknown to trl" in line], stderr
    if code == 0:
        assert request is not None
        assert request["model"]["dtype"] == recipe.get("dtype", recipe.get("torch_dtype"))  # bfloat16 stays bfloat16
        if "chat_template" in recipe:
            assert request["model"]["chat_template"] == recipe["chat_template"]
        if "warmup_ratio" in recipe:
            assert (
                request["training"]["warmup_steps"] == recipe["warmup_ratio"]
            )  # a fraction, as warmup_steps under 1 reads


def test_the_handbooks_older_mixer_and_its_splits_carry_with_the_test_split_to_evaluate_on() -> None:
    code, request, stderr = convert("handbook-zephyr-7b-beta-dpo-qlora.yaml", "dpo")
    assert code == 0, stderr
    assert request is not None and request["dataset"] == {
        "id": "HuggingFaceH4/ultrafeedback_binarized",
        "split": "train_prefs",
        "eval_split": "test_prefs",
    }
    assert request["training"]["eval_strategy"] == "steps" and request["model"]["quantization"] == "4bit"


def test_the_handbooks_mixture_carries_its_sources_and_says_how_its_weights_change_meaning() -> None:
    code, request, stderr = convert("handbook-zephyr-7b-beta-sft-qlora.yaml", "sft")
    recipe = yaml.safe_load((RECIPES / "handbook-zephyr-7b-beta-sft-qlora.yaml").read_text())["dataset_mixture"]
    assert any(line.startswith("dataset_mixture.datasets: carried, but each entry's fraction") for line in stderr), (
        stderr
    )
    assert any(line.startswith("dataset_mixture.seed: adapterd draws a mixture") for line in stderr), stderr
    # Its test_split_size is a count of rows (1000), as datasets' train_test_split reads an integer: carried as a count.
    assert recipe["test_split_size"] == 1000 and code == 0, stderr
    assert (
        request is not None
        and request["dataset"]["test_split_size"] == 1000
        and len(request["dataset"]["mixture"]) == len(recipe["datasets"])
    )


@pytest.mark.parametrize(
    "name", ["open-r1-qwen2.5-1.5b-grpo-demo.yaml", "open-r1-deepseek-r1-distill-qwen-1.5b-grpo-demo.yaml"]
)
def test_open_r1s_grpo_recipes_convert_with_their_rewards_in_the_ledger(name: str) -> None:
    from daemon.cli.convert.open_r1_rewards import FORMAT_PATTERN

    recipe = yaml.safe_load((RECIPES / name).read_text())
    code, request, stderr = convert(name, "grpo")
    assert code == 0 and request is not None, stderr
    assert recipe["reward_funcs"] == ["accuracy", "format", "tag_count"]
    assert request["rewards"] == {
        "functions": [
            {"name": "accuracy", "weight": recipe["reward_weights"][0]},
            {"name": "regex_match", "pattern": FORMAT_PATTERN, "weight": recipe["reward_weights"][1]},
            {"name": "tag_count", "weight": recipe["reward_weights"][2]},
        ]
    }
    said = {line.split(":")[0]: line for line in stderr}
    assert (
        said["reward_funcs.0"].startswith("reward_funcs.0: accuracy: carried as TRL's accuracy")
        and "first_match" in said["reward_funcs.0"]
    )
    assert said["reward_funcs.1"].startswith(
        "reward_funcs.1: format: carried as regex_match with open-r1's format_reward pattern"
    )
    assert said["reward_funcs.2"].startswith("reward_funcs.2: tag_count: carried as tag_count")
    assert "a request has no system prompt" in said["system_prompt"]
    assert "dataset_prompt_column" not in said  # carried: the recipe's `problem` column is read as the prompt
    assert request["dataset"]["columns"] == {"problem": "prompt"}


def test_open_r1s_own_config_keys_are_carried_or_said_and_only_its_sandboxed_reward_refuses(tmp_path: Path) -> None:
    """open-r1's codeforces recipe carries keys of open-r1's own config classes (its branch to push to, LightEval
    benchmarks, callbacks, W&B's entity) and a scale_rewards of TRL's older bool: each is carried or named, and the
    conversion fails on its code-running reward alone, which adapterd has no counterpart of."""
    name = "open-r1-qwen2.5-coder-7b-grpo-codeforces.yaml"
    code, request, stderr = convert(name, "grpo")
    lines = {line.split(":")[0]: line for line in stderr}
    errors = stderr[stderr.index(next(line for line in stderr if "is not valid" in line)) + 1 :]
    assert code == 1 and len(errors) == 1 and errors[0].strip().startswith("rewards: reward_funcs.0: cf_code"), stderr
    for key in ("benchmarks", "callbacks", "wandb_entity", "wandb_project"):
        assert "open-r1" in lines[key] and "unknown" not in lines[key], lines[key]
    assert "hub_model_revision" not in lines, stderr  # carried: said() leaves out the lines of keys carried as they are
    assert lines["scale_rewards"].startswith("scale_rewards: carried, but its value False is 'none' since trl 0.23.0")

    # Without the sandboxed reward, the recipe converts: pushed to open-r1's branch, the rewards scaled as TRL would.
    recipe = yaml.safe_load((RECIPES / name).read_text())
    recipe["reward_funcs"], recipe["reward_weights"] = recipe["reward_funcs"][1:], recipe["reward_weights"][1:]
    edited = tmp_path / "codeforces-format-only.yaml"
    edited.write_text(yaml.safe_dump(recipe))
    result = runner.invoke(
        app, ["convert", "trl-config", str(edited), "--method", "grpo", "--output-repo", "my-org/converted"]
    )
    assert result.exit_code == 0, result.stderr
    converted = json.loads(result.stdout)
    assert converted["output"]["revision"] == recipe["hub_model_revision"] == "v01.00"
    assert converted["grpo"]["scale_rewards"] == "none" and converted["grpo"]["loss_type"] == "dr_grpo"
