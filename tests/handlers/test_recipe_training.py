"""Each recipe in tests/recipes, converted by `adapterd convert trl-config`, trains on the tiny model
with its dataset replaced by rows of the same columns, and reaches TRL with every value it carried:
read back from the checkpoint's `training_args.bin` (and the PEFT config and the saved dtype).

What a CPU host cannot run is replaced, and each replacement is named here with its reason; every
other carried value must arrive unchanged."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.cli.demo.requests import PREFERENCE_ROWS
from handlers.protocol import TrainResult
from testbed.data import CHAT_ROWS
from tests.helpers import run_handler

RECIPES = Path(__file__).resolve().parents[1] / "recipes"
runner = CliRunner()

# ultrafeedback_binarized's and capybara-dpo's columns: chosen and rejected conversations
CONVERSATIONAL_PREFERENCES = [
    {
        "prompt": [{"role": "user", "content": row["prompt"]}],
        "chosen": [{"role": "assistant", "content": row["chosen"]}],
        "rejected": [{"role": "assistant", "content": row["rejected"]}],
    }
    for row in PREFERENCE_ROWS
]
MATH_ROWS = [{"problem": f"What is {i} plus {i}?", "solution": str(2 * i)} for i in range(4)]  # OpenR1-Math's columns
ROWS = {"sft": CHAT_ROWS, "dpo": CONVERSATIONAL_PREFERENCES, "orpo": CONVERSATIONAL_PREFERENCES, "grpo": MATH_ROWS}

# What the tiny CPU host replaces, and why; nothing else of the recipe is touched.
MODEL_OFF = (
    "revision",
    "attn_implementation",
    "use_bnb_nested_quant",
    "trust_remote_code",
)  # the Hub model's, flash-attn's (CUDA), QLoRA's (CUDA)
TRAINING = {
    "max_steps": 2,
    "save_steps": 2,  # two steps, and a checkpoint at the second to read back
    "report_to": [],  # wandb and tensorboard are not on this host
}
CUDA_ONLY_OPTIMIZERS = {
    "paged_adamw_32bit",
    "adamw_bnb_8bit",
}  # bitsandbytes' optimizers need CUDA: adamw_torch instead
METHOD = {
    "grpo": {"use_vllm": False, "max_completion_length": 8}
}  # vLLM needs CUDA; 8 tokens of the tiny model in place of 1024


def converted(name: str, method: str, tmp_path: Path) -> dict[str, Any]:
    path = RECIPES / name  # open-r1's GRPO recipes with their own rewards: accuracy, format and tag_count, as converted
    result = runner.invoke(
        app, ["convert", "trl-config", str(path), "--method", method, "--output-repo", "my-org/converted"]
    )
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def on_this_host(request: dict[str, Any], method: str, model: Path) -> tuple[dict[str, Any], set[str]]:
    """The request with what this host cannot run replaced; and the training and method fields replaced."""
    ours = copy.deepcopy(request)
    ours["model"] = {k: v for k, v in ours["model"].items() if k not in MODEL_OFF} | {
        "id": str(model),
        "quantization": "none",
    }
    carved = ours["dataset"].get("test_split_size")
    columns = request["dataset"].get("columns") or (request["dataset"].get("mixture") or [{}])[0].get("columns")
    ours["dataset"] = {"rows": ROWS[method]} | (
        {"columns": columns} if columns else {}
    )  # the recipe's renames kept (open-r1's problem -> prompt)
    if carved is not None:
        ours["dataset"]["test_split_size"] = (
            2 if isinstance(carved, int) else carved
        )  # the recipe's 1000 rows are more than these
    elif "eval_split" in request["dataset"]:
        ours["dataset"]["eval"] = {"rows": ROWS[method][:2]}
    training = dict(TRAINING)
    if ours["training"].get("optim") in CUDA_ONLY_OPTIMIZERS:
        training["optim"] = "adamw_torch"
    if ours["training"].get("use_liger_kernel"):
        training["use_liger_kernel"] = False  # liger's kernels are Triton (CUDA)
    ours["training"] = {**ours["training"], **training}
    ours[method] = {**ours.get(method, {}), **METHOD.get(method, {})}
    return ours, set(training) | {f"{method}.{k}" for k in METHOD.get(method, {})}


def plain(value: Any) -> Any:
    """A TrainingArguments value as the request writes it (an enum by its value)."""
    value = getattr(value, "value", value)
    return [plain(v) for v in value] if isinstance(value, list | tuple) else value


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "method"),
    [
        ("handbook-zephyr-7b-beta-sft-qlora.yaml", "sft"),
        ("handbook-smollm3-sft.yaml", "sft"),
        ("open-r1-distill-7b-sft.yaml", "sft"),
        ("handbook-zephyr-7b-beta-dpo-qlora.yaml", "dpo"),
        ("handbook-zephyr-141b-orpo-full.yaml", "orpo"),
        ("open-r1-qwen2.5-1.5b-grpo-demo.yaml", "grpo"),
        ("open-r1-deepseek-r1-distill-qwen-1.5b-grpo-demo.yaml", "grpo"),
    ],
)
def test_each_converted_recipe_trains_and_reaches_trl_with_every_carried_value(
    name: str, method: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch

    request, replaced = on_this_host(converted(name, method, tmp_path), method, tiny_model_dir)
    result, _ = run_handler(request, tmp_path / "job")
    assert isinstance(result, TrainResult), result
    if method == "grpo":  # the recipe's rewards, converted, are what TRL scored with
        assert [f["name"] for f in request["rewards"]["functions"]] == ["accuracy", "regex_match", "tag_count"]
    args = torch.load(tmp_path / "job" / "checkpoints" / "checkpoint-2" / "training_args.bin", weights_only=False)
    carried = {**request["training"], **{f"{method}.{k}": v for k, v in request[method].items()}}
    assert len(set(carried) - replaced) >= 8, carried  # the recipe's own values, not only the host's
    differing = {
        key: (value, plain(getattr(args, key.removeprefix(f"{method}."))))
        for key, value in carried.items()
        if key not in replaced and plain(getattr(args, key.removeprefix(f"{method}."))) != value
    }
    assert differing == {}, differing  # key: (the recipe's value, what TRL was given)
    artifact = tmp_path / "job" / "artifact"
    if request["peft"] is None:  # a full fine-tune saves the model in the recipe's dtype
        assert json.loads((artifact / "config.json").read_text())["dtype"] == request["model"]["dtype"]
    else:
        adapter = json.loads((artifact / "adapter_config.json").read_text())
        assert {k: adapter[k] for k in ("r", "lora_alpha", "lora_dropout")} == {
            k: request["peft"][k] for k in ("r", "lora_alpha", "lora_dropout")
        }
        assert set(adapter["target_modules"]) == set(request["peft"]["target_modules"])
