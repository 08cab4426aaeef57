"""A job started from what an earlier request published (`start_from`, issue 63), through the handlers in this
process: DPO from an SFT adapter trains that adapter, with it as the reference, and pushes it alone."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from safetensors.torch import load_file

from daemon.cli.demo.requests import PREFERENCE_ROWS
from handlers.protocol import StartPoint
from tests.helpers import SMALL_LORA, SMALL_TRAINING, example_request, run_handler

SAME_AS_POLICY = math.log(2)  # DPO's first sigmoid loss when the reference is the policy as it starts


def _sft(tiny_model_dir: Path, work: Path) -> Path:
    rows = [{"prompt": "2+2=", "completion": "4"}, {"prompt": "3+3=", "completion": "6"}] * 4
    done, _ = run_handler(
        example_request("sft", "chain-sft", model={"id": str(tiny_model_dir)}, dataset={"rows": rows}, peft=SMALL_LORA),
        work,
    )
    assert done.trainer == "trl.SFTTrainer/trl.SFTConfig", done
    return work / "artifact"


def _dpo(tiny_model_dir: Path, request_id: str, **overrides: object) -> dict[str, object]:
    return example_request(
        "dpo",
        request_id,
        model={"id": str(tiny_model_dir)},
        dataset={"rows": PREFERENCE_ROWS},
        training={**SMALL_TRAINING, "max_steps": 2},
        after=["chain-sft"],
        start_from="chain-sft",
        **overrides,
    )


@pytest.mark.slow
def test_dpo_starts_from_the_sft_adapter_trained_and_as_its_reference(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = _sft(tiny_model_dir, tmp_path / "sft")
    start = StartPoint(request_id="chain-sft", repo_id="results/chain-sft", folder=adapter)

    # The reference is the SFT adapter, as the policy starts: the first loss is log 2 ...
    done, _ = run_handler(_dpo(tiny_model_dir, "chain-dpo"), tmp_path / "dpo", start=start)
    assert done.trainer == "trl.DPOTrainer/trl.DPOConfig", done
    assert done.metrics["first_loss"] == pytest.approx(SAME_AS_POLICY, abs=1e-4)
    # ... and against the bare base as reference it is not: the policy started as the SFT adapter, not the base.
    against_base, _ = run_handler(
        _dpo(tiny_model_dir, "chain-dpo-base", ref_model={"id": str(tiny_model_dir)}), tmp_path / "base", start=start
    )
    assert against_base.metrics["first_loss"] != pytest.approx(SAME_AS_POLICY, abs=1e-3), against_base.metrics

    # What is pushed is the trained adapter alone (no copy of the reference), in the SFT adapter's LoRA shape, and
    # training moved it from where the SFT left it.
    artifact = tmp_path / "dpo" / "artifact"
    assert not (artifact / "ref").exists()
    assert json.loads((artifact / "adapter_config.json").read_text())["r"] == SMALL_LORA["r"]
    before, after = (load_file(folder / "adapter_model.safetensors") for folder in (adapter, artifact))
    assert set(before) == set(after)
    assert any(not before[name].equal(after[name]) for name in before)


@pytest.mark.slow
def test_sft_from_a_merged_model_takes_it_for_the_base(tiny_model_dir: Path, tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file as load

    rows = [{"prompt": "2+2=", "completion": "4"}] * 4
    merged, _ = run_handler(
        example_request(
            "sft",
            "chain-merged",
            model={"id": str(tiny_model_dir)},
            dataset={"rows": rows},
            output={"repo_id": "results/chain-merged", "push": "merged"},
        ),
        tmp_path / "merged",
    )
    folder = tmp_path / "merged" / "artifact"
    assert not (folder / "adapter_config.json").exists()
    start = StartPoint(request_id="chain-merged", repo_id="results/chain-merged", folder=folder)
    again, _ = run_handler(
        example_request(
            "sft",
            "chain-next",
            model={"id": str(tiny_model_dir)},
            dataset={"rows": rows},
            training={**SMALL_TRAINING, "max_steps": 1, "learning_rate": 1e-12},
            output={"repo_id": "results/chain-next", "push": "merged"},
            after=["chain-merged"],
            start_from="chain-merged",
        ),
        tmp_path / "next",
        start=start,
    )
    assert merged.trainer == again.trainer == "trl.SFTTrainer/trl.SFTConfig", again
    # Next to no learning: what is pushed is the base it started from, the merged model, not the tiny model it named.
    start_weights, pushed = (load(each / "model.safetensors") for each in (folder, tmp_path / "next" / "artifact"))
    base = load(tiny_model_dir / "model.safetensors")
    assert all(torch.allclose(start_weights[name], pushed[name], atol=1e-6) for name in start_weights)
    assert any(not torch.allclose(base[name], pushed[name], atol=1e-4) for name in base if name in pushed)


@pytest.mark.slow
def test_grpo_starts_from_the_sft_adapter(tiny_model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from daemon.cli.demo.requests import PROMPT_ROWS

    adapter = _sft(tiny_model_dir, tmp_path / "sft")
    start = StartPoint(request_id="chain-sft", repo_id="results/chain-sft", folder=adapter)
    request = example_request(
        "grpo",
        "chain-grpo",
        model={"id": str(tiny_model_dir)},
        dataset={"rows": PROMPT_ROWS},
        grpo={"num_generations": 4, "max_completion_length": 8, "beta": 0.04},
        training={**SMALL_TRAINING, "max_steps": 1, "per_device_train_batch_size": 4},
        peft={"r": 8, "lora_alpha": 16},  # not applied: the SFT adapter's own configuration is trained on
        after=["chain-sft"],
        start_from="chain-sft",
    )
    done, _ = run_handler(request, tmp_path / "grpo", start=start)
    assert done.trainer == "trl.GRPOTrainer/trl.GRPOConfig", done
    assert f"start_from chain-sft: {adapter} (adapter, trainable and as the reference)" in capsys.readouterr().err
    artifact = tmp_path / "grpo" / "artifact"
    assert json.loads((artifact / "adapter_config.json").read_text())["r"] == SMALL_LORA["r"]
    assert not (artifact / "ref").exists()
