"""The host's speed settings (issue 39, `JobSpec.fast`, handlers/toolkit/fast.py): each applied only where the
request leaves the same field unset, only where this host can run it (else left off, or sdpa for a
flash attention, and logged), recorded in `TrainResult.fast`; and none changes what is learned: a tiny
SFT job's per-step losses with each setting equal those with TRL's and transformers' defaults.

The same-loss runs: the tiny model, LoRA, a fixed seed, 6 steps of 2 rows logged at every step, on
whatever device the host has (the CPU here); nothing that changes the batches (packing, an automatic
batch size) is on. The losses are the trainer's own (`log_history` of the last checkpoint), and each
run is checked to have run with the setting (the checkpoint's training arguments, the layers
recomputed, the attention the model was loaded with), so that two equal columns cannot come from a
setting that was never applied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from trl import SFTConfig

from handlers.protocol import JobSpec, TrainResult
from handlers.toolkit import fast, loading
from handlers.toolkit.loading import model_kwargs
from handlers.toolkit.reporting import StatusReporter
from handlers.toolkit.training import trl_config
from schemas import SFTRequest
from schemas.request import ModelSpec
from testbed.data import CHAT_ROWS
from tests.helpers import run_handler, sft_request

# Relative, per step. Gradient checkpointing recomputes each layer's forward pass in the backward
# one with the same kernels on the same inputs: the same float32 numbers, so equal but for a host
# whose kernels are not deterministic (equal bit for bit here).
CHECKPOINTING_TOLERANCE = 1e-6
# sdpa and eager compute the same attention in another order (sdpa's fused kernel sums in blocks with
# a running softmax; eager multiplies, softmaxes and multiplies again): float32 rounding, 3.6e-6
# relative in step 1's loss here, which each later step carries through Adam's updates. Adam
# amplifies it (its step is about lr times the gradient's sign where a gradient is small): at a
# learning rate of 3e-2 a step differed by 2.6e-4, at this job's 1e-2 by at most 1.5e-5 over 8 steps.
# 1e-4 leaves room for another CPU and stays below what a wrong training argument moves a step by
# (a learning rate 10% off: 4e-4 and more, tests/handlers/test_fidelity.py).
ATTENTION_TOLERANCE = 1e-4
# Liger's kernels fuse the final linear layer with the cross entropy and compute it in chunks, on the
# GPU (Triton): a different order of float32 sums again, over the vocabulary as well.
LIGER_TOLERANCE = 1e-3
TRAINING = {"max_steps": 6, "learning_rate": 1e-2, "per_device_train_batch_size": 2, "seed": 7, "logging_steps": 1}


@pytest.fixture(autouse=True)
def no_host_attention(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host's attention is the process's, chosen per job: none is left behind by a test."""
    monkeypatch.setattr(fast, "_attention", None)


@pytest.fixture
def reporter() -> Iterator[StatusReporter]:
    """The job's reporter, which records the settings applied (`StatusReporter.fast`)."""
    read, write = os.pipe()
    active = StatusReporter(write)
    yield active
    active.close()
    os.close(read)


def job_spec(tmp_path: Path, **fast_settings: Any) -> JobSpec:
    return JobSpec(
        request={},
        checkpoints=tmp_path / "checkpoints",
        artifact=tmp_path / "artifact",
        progress_interval_s=0,
        fast=fast_settings,
    )


def sft_config(tmp_path: Path, training: dict[str, Any] | None = None, **fast_settings: Any) -> SFTConfig:
    request = SFTRequest.model_validate(sft_request("fast-config", training={"max_steps": 4, **(training or {})}))
    return trl_config(SFTConfig, request, job_spec(tmp_path, **fast_settings), "sft")


def test_the_hosts_gradient_checkpointing_applies_where_the_request_leaves_it_unset(
    tmp_path: Path, reporter: StatusReporter
) -> None:
    assert sft_config(tmp_path).activation_checkpointing is True  # TRL's own default
    assert reporter.fast == {}
    off = sft_config(tmp_path, gradient_checkpointing=False)
    assert off.activation_checkpointing is False and off.gradient_checkpointing is False
    assert reporter.fast == {"gradient_checkpointing": False}


@pytest.mark.parametrize("field", ["gradient_checkpointing", "activation_checkpointing"])
def test_the_requests_own_gradient_checkpointing_wins(field: str, tmp_path: Path, reporter: StatusReporter) -> None:
    config = sft_config(tmp_path, {field: True}, gradient_checkpointing=False)
    assert config.activation_checkpointing is True
    assert reporter.fast == {}


def test_liger_not_installed_is_left_off_and_said(
    tmp_path: Path, reporter: StatusReporter, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Runs wherever liger_kernel is installed or not: the check is made to answer 'not installed'."""
    monkeypatch.setattr(fast, "liger_installed", lambda: False)
    assert sft_config(tmp_path, use_liger_kernel=True).use_liger_kernel is False
    assert "use_liger_kernel" not in reporter.fast
    said = capsys.readouterr().out
    assert (
        "job.fast_setting_unavailable setting=use_liger_kernel wanted=True using=False "
        "reason=liger_kernel is not installed" in said
    )
    assert sft_config(tmp_path, use_liger_kernel=False).use_liger_kernel is False  # off needs nothing installed
    assert reporter.fast == {"use_liger_kernel": False}


def test_liger_installed_is_applied_unless_the_request_says(
    tmp_path: Path, reporter: StatusReporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fast, "liger_installed", lambda: True)
    assert sft_config(tmp_path, use_liger_kernel=True).use_liger_kernel is True
    assert reporter.fast == {"use_liger_kernel": True}
    reporter.fast.clear()
    assert sft_config(tmp_path, {"use_liger_kernel": False}, use_liger_kernel=True).use_liger_kernel is False
    assert reporter.fast == {}


def test_the_hosts_attention_loads_every_model_unless_the_request_names_one(
    tmp_path: Path, reporter: StatusReporter, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ModelSpec(id="tiny/qwen2-chat")
    fast.choose_attention(base, job_spec(tmp_path, attn_implementation="eager"))
    assert model_kwargs(base)["attn_implementation"] == "eager"
    assert (
        model_kwargs(base.model_copy(update={"id": "tiny/reference"}))["attn_implementation"] == "eager"
    )  # a reference, loaded like the base
    assert reporter.fast == {"attn_implementation": "eager"}
    reporter.fast.clear()
    own = ModelSpec(id="tiny/qwen2-chat", attn_implementation="sdpa")
    fast.choose_attention(own, job_spec(tmp_path, attn_implementation="eager"))
    assert model_kwargs(own)["attn_implementation"] == "sdpa" and reporter.fast == {}
    fast.choose_attention(base, job_spec(tmp_path))  # the next job, without the host's choice: transformers' default
    assert "attn_implementation" not in model_kwargs(base)
    assert capsys.readouterr().out == ""


def test_a_flash_attention_this_host_cannot_run_falls_back_to_sdpa_and_says_so(
    tmp_path: Path, reporter: StatusReporter, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ModelSpec(id="tiny/qwen2-chat")
    monkeypatch.setattr(fast.torch.cuda, "is_available", lambda: False)
    fast.choose_attention(base, job_spec(tmp_path, attn_implementation="flash_attention_2"))
    assert model_kwargs(base)["attn_implementation"] == "sdpa" and reporter.fast == {"attn_implementation": "sdpa"}
    assert (
        "job.fast_setting_unavailable setting=attn_implementation wanted=flash_attention_2 using=sdpa "
        "reason=flash attention needs a CUDA GPU and this host has none"
    ) in capsys.readouterr().out
    # With a GPU: flash attention needs its own package or the Hub's kernels.
    monkeypatch.setattr(fast.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fast, "installed", lambda module: False)
    assert fast.attention_unavailable("flash_attention_3") == "neither flash_attn_interface nor kernels is installed"
    assert fast.attention_unavailable("kernels-community/flash-attn2") == "neither kernels is installed"
    monkeypatch.setattr(fast, "installed", lambda module: module == "kernels")
    assert fast.attention_unavailable("flash_attention_2") is None
    fast.choose_attention(base, job_spec(tmp_path, attn_implementation="flash_attention_2"))
    assert model_kwargs(base)["attn_implementation"] == "flash_attention_2"
    fast.choose_attention(base, job_spec(tmp_path))
    assert all(fast.attention_unavailable(name) is None for name in ("eager", "sdpa"))


def test_the_fast_settings_cross_the_pipe() -> None:
    spec = JobSpec(
        request={},
        checkpoints=Path("/c"),
        artifact=Path("/a"),
        progress_interval_s=0,
        memory_fraction=0.5,
        fast={"gradient_checkpointing": False, "attn_implementation": "kernels-community/flash-attn2"},
    )
    assert JobSpec.model_validate_json(spec.model_dump_json()) == spec
    assert (
        JobSpec.model_validate_json(
            JobSpec(request={}, checkpoints=Path("/c"), artifact=Path("/a"), progress_interval_s=0).model_dump_json()
        ).fast.attn_implementation
        is None
    )
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="memory_fraction"):
            JobSpec(request={}, checkpoints=Path("/c"), artifact=Path("/a"), progress_interval_s=0, memory_fraction=bad)


# The same losses: a few seconds of training each (two runs for the attention), so marked slow.

Run = tuple[TrainResult, dict[int, float], Any, list[str], int]


def run(tiny_model_dir: Path, work: Path, **fast_settings: Any) -> Run:
    """A tiny SFT job with the host's `fast_settings`: its result, the trainer's per-step losses, its
    training arguments, the attention each causal LM it loaded ran with, and how many layer calls
    gradient checkpointing ran (transformers' `checkpoint`, which recomputes them in the backward pass)."""
    import transformers.modeling_utils

    attentions: list[str] = []
    recomputed = 0
    real = loading.AutoModelForCausalLM
    real_checkpoint = transformers.modeling_utils.checkpoint

    def checkpoint(*args: Any, **kwargs: Any) -> Any:
        nonlocal recomputed
        recomputed += 1
        return real_checkpoint(*args, **kwargs)

    class Spy:
        @staticmethod
        def from_pretrained(*args: Any, **kwargs: Any) -> Any:
            model = real.from_pretrained(*args, **kwargs)
            attentions.append(model.config._attn_implementation)
            return model

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(loading, "AutoModelForCausalLM", Spy)
        patch.setattr(transformers.modeling_utils, "checkpoint", checkpoint)
        request = sft_request(
            "fast-losses",
            model={"id": str(tiny_model_dir)},
            dataset={"rows": CHAT_ROWS},
            training=TRAINING,
            sft={"max_length": 64},
        )
        result, sent = run_handler(request, work, fast=fast_settings)
    assert isinstance(result, TrainResult), result
    last = max((work / "checkpoints").glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))
    losses = {
        entry["step"]: entry["loss"]
        for entry in json.loads((last / "trainer_state.json").read_text())["log_history"]
        if "loss" in entry
    }
    assert losses == {m["step"]: m["loss"] for m in sent if m["kind"] == "progress" and m.get("loss") is not None}
    assert list(losses) == list(range(1, TRAINING["max_steps"] + 1))
    arguments = torch.load(last / "training_args.bin", weights_only=False)
    assert not arguments.packing and not arguments.auto_find_batch_size  # nothing that changes the batches
    return result, losses, arguments, attentions, recomputed


@pytest.fixture(scope="module")
def defaults(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The run with TRL's and transformers' defaults: no host setting."""
    return run(tiny_model_dir, tmp_path_factory.mktemp("fast-defaults"))


def assert_same_losses(
    name: str,
    expected: dict[int, float],
    measured: dict[int, float],
    tolerance: float,
    columns: tuple[str, str] = ("defaults", "with the setting"),
) -> None:
    print(f"\n{name}: per-step training loss, tolerance {tolerance:g} relative")
    print(f"{'step':>4}  {columns[0]:>18}  {columns[1]:>18}  {'relative':>9}")
    for step, loss in expected.items():
        print(f"{step:>4}  {loss:>18.12f}  {measured[step]:>18.12f}  {abs(measured[step] - loss) / abs(loss):>9.2e}")
    differing = {
        step: (loss, measured[step])
        for step, loss in expected.items()
        if abs(measured[step] - loss) > tolerance * abs(loss)
    }
    assert not differing, f"{name}: per-step losses differ ({', '.join(columns)}): {differing}"


@pytest.mark.slow
def test_gradient_checkpointing_off_learns_what_trls_default_on_learns(
    defaults: Run, tiny_model_dir: Path, tmp_path: Path
) -> None:
    base_result, base_losses, base_arguments, _, base_recomputed = defaults
    result, losses, arguments, _, recomputed = run(tiny_model_dir, tmp_path, gradient_checkpointing=False)
    assert base_arguments.activation_checkpointing is True and arguments.activation_checkpointing is False
    assert base_recomputed > 0 and recomputed == 0
    assert base_result.fast == {} and result.fast == {"gradient_checkpointing": False}
    assert_same_losses("gradient_checkpointing off vs TRL's default (on)", base_losses, losses, CHECKPOINTING_TOLERANCE)


@pytest.mark.slow
def test_sdpa_and_eager_attention_learn_the_same(defaults: Run, tiny_model_dir: Path, tmp_path: Path) -> None:
    _, base_losses, _, base_attentions, _ = defaults
    sdpa_result, sdpa, _, sdpa_attentions, _ = run(tiny_model_dir, tmp_path / "sdpa", attn_implementation="sdpa")
    eager_result, eager, _, eager_attentions, _ = run(tiny_model_dir, tmp_path / "eager", attn_implementation="eager")
    assert (base_attentions, sdpa_attentions, eager_attentions) == (
        ["sdpa"],
        ["sdpa"],
        ["eager"],
    )  # transformers' default is sdpa
    assert sdpa_result.fast == {"attn_implementation": "sdpa"} and eager_result.fast == {"attn_implementation": "eager"}
    assert_same_losses(
        "attn_implementation sdpa vs transformers' default (sdpa)", base_losses, sdpa, CHECKPOINTING_TOLERANCE
    )
    assert_same_losses("attn_implementation eager vs sdpa", sdpa, eager, ATTENTION_TOLERANCE, ("sdpa", "eager"))


@pytest.mark.slow
def test_liger_learns_what_trls_default_learns(defaults: Run, tiny_model_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("liger_kernel")
    if not torch.cuda.is_available():
        pytest.skip("Liger's kernels are Triton kernels: they need a GPU")
    _, base_losses, base_arguments, _, _ = defaults
    result, losses, arguments, _, _ = run(tiny_model_dir, tmp_path, use_liger_kernel=True)
    assert base_arguments.use_liger_kernel is False and arguments.use_liger_kernel is True
    assert result.fast == {"use_liger_kernel": True}
    assert_same_losses("use_liger_kernel on vs TRL's default (off)", base_losses, losses, LIGER_TOLERANCE)
