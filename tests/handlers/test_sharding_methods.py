"""DPO, reward, KTO and GRPO sharded (`resources.shard: fsdp`) on two CPU ranks, each against the same job run
data-parallel with the same global batch, as test_sharding.py runs SFT: each rank holds half of the base, the
reference (where there is one) is whole or the adapter-disabled policy, and the losses are the data-parallel job's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.cli.demo.requests import PREFERENCE_ROWS
from tests.handlers.test_sharding import (
    LOSS_RTOL,
    TINY_PARAMS,
    assert_same_logits,
    assert_same_losses,
    logits_of,
    run_two_ranks,
    step_losses,
)
from tests.helpers import SMALL_LORA, example_request


def two_gpu(
    method: str, request_id: str, model: Path, shard: str, rows: list[dict[str, Any]], **overrides: Any
) -> dict[str, Any]:
    """The README's example of `method` on the tiny model as a job of two GPUs: per-device batch 2, a global batch of 4,
    4 steps; with an `evaluation`, the rows are its eval set too."""
    dataset = {"rows": rows, **({"eval": {"rows": rows}} if "evaluation" in overrides else {})}
    return example_request(
        method,
        request_id,
        model={"id": str(model), "dtype": "float32"},
        dataset=dataset,
        training={"max_steps": 4, "learning_rate": 1e-2, "per_device_train_batch_size": 2},
        resources={"gpus": 2, "shard": shard},
        **overrides,
    )


def assert_holds_half(sharded: dict[str, Any], whole: dict[str, Any], base: int, full: bool) -> None:
    """Each rank of the sharded job holds half of the base (FSDP2 shards each parameter on its first dimension) and,
    with LoRA, the whole adapter (attached after the sharding); each of the data-parallel job's, all of it."""
    adapter = 0 if full else whole["metrics"]["rank0_trainable_param_count"]
    assert full or 0 < adapter < base / 4
    for rank in (0, 1):
        assert sharded["metrics"][f"rank{rank}_param_count"] == base / 2 + adapter
        assert sharded["metrics"][f"rank{rank}_trainable_param_count"] == (base / 2 if full else adapter)
        assert whole["metrics"][f"rank{rank}_param_count"] == base + adapter


@pytest.mark.slow
@pytest.mark.parametrize("peft", [SMALL_LORA, None], ids=["lora", "full"])
def test_a_sharded_dpo_holds_half_the_policy_per_rank_and_trains_as_data_parallel(
    tiny_model_dir: Path,
    tmp_path: Path,
    peft: dict[str, Any] | None,
) -> None:
    """The reference: with LoRA, the sharded policy with its adapter switched off (nothing more is loaded); for a
    full fine-tune, TRL's own copy of the base, loaded whole on each rank (not sharded: it is never trained, and
    FSDP2 would gather it layer by layer for every forward). Either way the losses are the data-parallel job's."""
    rows, dpo = PREFERENCE_ROWS, {"beta": 0.1, "max_length": 64}
    # The evaluation (the method's own measure, and with LoRA the base as a baseline: a fresh adapter) runs sharded too.
    evaluation = {"evaluation": {"baselines": ["base"] if peft is not None else [], "on_fail": "none"}}
    sharded, sharded_messages = run_two_ranks(
        two_gpu("dpo", "dpo-fsdp", tiny_model_dir, "fsdp", rows, peft=peft, dpo=dpo, **evaluation), tmp_path / "fsdp"
    )
    whole, whole_messages = run_two_ranks(
        two_gpu("dpo", "dpo-dp", tiny_model_dir, "none", rows, peft=peft, dpo=dpo, **evaluation), tmp_path / "dp"
    )
    assert_holds_half(sharded, whole, TINY_PARAMS, full=peft is None)
    pushed = {p.name for p in (tmp_path / "fsdp/artifact").iterdir()}
    assert ("model.safetensors" if peft is None else "adapter_model.safetensors") in pushed
    if peft is not None:  # the adapter, loaded with PEFT on the base, gives the data-parallel child's trained logits
        fsdp, dp = (logits_of(tiny_model_dir, tmp_path / job / "artifact") for job in ("fsdp", "dp"))
        assert_same_logits(fsdp, dp, logits_of(tiny_model_dir))
    for rank in (
        0,
        1,
    ):  # what daemon/resources/memory.py counts: the reference's weights whole on each rank (copies_base_as_reference)
        assert sharded["metrics"].get(f"rank{rank}_ref_param_count") == (TINY_PARAMS if peft is None else None)
    assert_same_losses(step_losses(sharded_messages), step_losses(whole_messages))
    measured, expected = sharded["evaluation"], whole["evaluation"]
    assert set(measured["baselines"]) == set(expected["baselines"]) == ({"base"} if peft is not None else set())
    for who in ("adapter", *expected["baselines"]):
        got = measured[who]["metrics"] if who == "adapter" else measured["baselines"][who]["metrics"]
        want = expected[who]["metrics"] if who == "adapter" else expected["baselines"][who]["metrics"]
        assert "eval_loss" in want and got == pytest.approx(want, rel=LOSS_RTOL, abs=1e-6)


@pytest.mark.slow
def test_a_sharded_full_reward_model_holds_half_the_classifier_per_rank_and_trains_as_data_parallel(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """A full fine-tune of a reward model: the sequence classifier (the base and its new one-output score head) sharded
    as it loads. FSDP2 shards each parameter on its first dimension, and the score head's (1 × hidden) is one row:
    rank 0 holds it, rank 1 none of it. (With LoRA, PEFT trains a copy of the score head beside the sharded one,
    which FSDP2 never gathers: refused, schemas/request_base.py `sharding_problem`.)"""
    import shutil

    import torch
    from transformers import AutoModelForSequenceClassification

    # The base is a reward model already (a score head saved with it): a new head is initialised at random as it
    # loads, differently whole and sharded, and the two jobs would start from different models.
    base = tmp_path / "classifier"
    shutil.copytree(tiny_model_dir, base)
    torch.manual_seed(0)
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(base)
    rows, reward, output = PREFERENCE_ROWS, {"max_length": 64}, {"repo_id": "results/reward", "push": "adapter"}
    sharded, sharded_messages = run_two_ranks(
        two_gpu("reward", "reward-fsdp", base, "fsdp", rows, peft=None, reward=reward, output=output), tmp_path / "fsdp"
    )
    whole, whole_messages = run_two_ranks(
        two_gpu("reward", "reward-dp", base, "none", rows, peft=None, reward=reward, output=output), tmp_path / "dp"
    )
    score = 32  # the tiny model's hidden size: the score head's one row
    classifier = whole["metrics"]["rank0_param_count"]
    assert classifier == TINY_PARAMS + score == whole["metrics"]["rank1_param_count"]
    assert sharded["metrics"]["rank0_param_count"] == TINY_PARAMS / 2 + score
    assert sharded["metrics"]["rank1_param_count"] == TINY_PARAMS / 2
    assert sharded["metrics"]["rank1_trainable_param_count"] == TINY_PARAMS / 2
    assert_same_losses(step_losses(sharded_messages), step_losses(whole_messages))


@pytest.mark.slow
def test_a_sharded_lora_kto_holds_half_the_base_per_rank_and_trains_as_data_parallel(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The reference is the sharded policy with its adapter switched off, as for DPO; KTO's KL estimate, gathered
    across the ranks, is the same either way."""
    rows = [
        {"prompt": row["prompt"], "completion": row[column], "label": column == "chosen"}
        for row in PREFERENCE_ROWS
        for column in ("chosen", "rejected")
    ]
    kto = {"beta": 0.1, "max_length": 64}
    sharded, sharded_messages = run_two_ranks(
        two_gpu("kto", "kto-fsdp", tiny_model_dir, "fsdp", rows, peft=SMALL_LORA, kto=kto), tmp_path / "fsdp"
    )
    whole, whole_messages = run_two_ranks(
        two_gpu("kto", "kto-dp", tiny_model_dir, "none", rows, peft=SMALL_LORA, kto=kto), tmp_path / "dp"
    )
    assert_holds_half(sharded, whole, TINY_PARAMS, full=False)
    assert_same_losses(step_losses(sharded_messages), step_losses(whole_messages))


@pytest.mark.slow
def test_a_sharded_lora_grpo_generates_from_the_sharded_policy_and_trains_as_data_parallel(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """GRPO's completions come from the sharded policy's `generate` (transformers keeps the ranks in step,
    `synced_gpus`, for a model FSDP manages: a rank whose completions end early runs forward passes until every rank's
    have). Sampling draws the same numbers on each rank either way, so the completions, rewards and losses are the
    data-parallel job's."""
    from daemon.cli.demo.requests import PROMPT_ROWS

    grpo = {"num_generations": 2, "max_completion_length": 8, "beta": 0.0}
    sharded, sharded_messages = run_two_ranks(
        two_gpu("grpo", "grpo-fsdp", tiny_model_dir, "fsdp", PROMPT_ROWS, grpo=grpo), tmp_path / "fsdp"
    )
    whole, whole_messages = run_two_ranks(
        two_gpu("grpo", "grpo-dp", tiny_model_dir, "none", PROMPT_ROWS, grpo=grpo), tmp_path / "dp"
    )
    assert_holds_half(sharded, whole, TINY_PARAMS, full=False)
    # GRPO's loss without a KL term is about 0 on-policy (its gradient is not): the losses are compared near 0, and
    # the steps' gradient norms, which other completions or rewards would change, to the same tolerance.
    assert step_losses(sharded_messages) == pytest.approx(step_losses(whole_messages), rel=LOSS_RTOL, abs=1e-6)
    norms = [
        [m["grad_norm"] for m in messages if m["kind"] == "progress"] for messages in (sharded_messages, whole_messages)
    ]
    assert len(norms[0]) == 4 and norms[0] == pytest.approx(norms[1], rel=LOSS_RTOL) and max(norms[0]) > 0.01
