"""Sharded training (`resources.shard: fsdp`, handlers/toolkit/distributed/fsdp.py) on two CPU ranks standing in for
two GPUs: the child launched as the daemon launches a job of two GPUs (`python -m handlers.child.launch 2`,
torchrun's agent and two workers, gloo), on the tiny model. A sharded job's ranks each hold half of the
base's parameters (what the child reports in `succeeded`'s metrics), and its per-step losses are those of
the same job run data-parallel with the same global batch; stopped, it resumes from its checkpoint at the step
after it (handlers/toolkit/distributed/checkpoints.py) with the losses of a run never stopped. Its progress and result
say each rank's tokens/s and peak memory (the largest as the job's), and its one log marks each rank's lines.
The other methods sharded: test_sharding_methods.py; the estimate against the ranks' peaks: test_sharded_memory.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from handlers.protocol import JobSpec
from testbed.data import CHAT_ROWS
from tests.helpers import sft_request

# Sharded and data-parallel losses differ only by the order of floating-point sums (a reduce-scatter
# against an all-reduce), which Adam's steps then carry: equal on some CPUs, 2.3e-4 apart (relative) at the
# fourth step of a full-fine-tune DPO on an Intel Xeon with AVX-512 (the sum's order is the CPU's kernels').
# Below this on any CPU, and far above it when the ranks train on other batches or one rank's gradient is
# lost (a step's update, which moves the loss by a tenth or more here).
LOSS_RTOL = 1e-3
TINY_PARAMS = 28_960  # the tiny model's parameters (handlers/fixtures/tiny_model.py)


def launch_two_ranks(
    request: dict[str, Any], work: Path, stop_at_step: int | None = None
) -> tuple[int, list[dict[str, Any]]]:
    """Run `request` as a job of two GPUs on this CPU, as the daemon launches one (daemon/children/warm.py `launch`):
    the launcher's exit status and every message on the status pipe; SIGTERM (the daemon's stop) once the job
    reports `stop_at_step`. The job's folder may hold an earlier attempt's checkpoints."""
    work.mkdir(parents=True, exist_ok=True)
    spec = work / "spec.json"
    spec.write_text(
        JobSpec(
            request=request, checkpoints=work / "checkpoints", artifact=work / "artifact", progress_interval_s=0
        ).model_dump_json()
    )
    read, write = os.pipe()
    env = {
        **os.environ,
        "CUDA_VISIBLE_DEVICES": "",
        "ADAPTERD_STATUS_FD": str(write),
        "ADAPTERD_PARENT_PID": str(os.getpid()),
        "ADAPTERD_JOB": json.dumps({"spec": str(spec), "log": str(work / "child.log")}),
    }
    with open(work / "child.log", "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "handlers.child.launch", "2"],
            env=env,
            pass_fds=(write,),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    os.close(write)
    messages = []
    with os.fdopen(read) as pipe:
        for line in pipe:
            messages.append(json.loads(line))
            if stop_at_step is not None and messages[-1]["kind"] == "progress" and messages[-1]["step"] == stop_at_step:
                process.send_signal(signal.SIGTERM)
    with open(work / "status.jsonl", "a") as kept:  # beside the child's log, for a failure's reader
        kept.writelines(json.dumps(message) + "\n" for message in messages)
    return process.wait(timeout=600), messages


def run_two_ranks(request: dict[str, Any], work: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run `request` as a job of two GPUs on this CPU: its `result` message and every message on the status pipe."""
    returncode, messages = launch_two_ranks(request, work)
    assert returncode == 0, (work / "child.log").read_text()[-4000:]
    results = [m for m in messages if m["kind"] == "result"]
    assert len(results) == 1, messages  # rank 0 reports; rank 1 is silent
    return results[0], messages


def step_losses(messages: list[dict[str, Any]]) -> list[float]:
    return [m["loss"] for m in messages if m["kind"] == "progress" and m.get("loss") is not None]


def two_gpu_sft(request_id: str, model: Path, shard: str, **overrides: Any) -> dict[str, Any]:
    # Per-device batch 2 on two ranks: a global batch of 4 either way, 4 steps over 6 rows.
    return sft_request(
        request_id,
        model={"id": str(model), "dtype": "float32"},
        dataset={"rows": CHAT_ROWS},
        sft={"max_length": 64},
        resources={"gpus": 2, "shard": shard},
        **overrides,
    )


def assert_rank_figures(result: dict[str, Any], messages: list[dict[str, Any]], log: str) -> None:
    """Each rank's figures (handlers/toolkit/distributed/ranks.py) in a two-rank job's progress and
    result, and its lines in the log."""
    progress = [m for m in messages if m["kind"] == "progress"]
    for report in progress:
        assert [rank["rank"] for rank in report["ranks"]] == [0, 1]
        assert report["peak_bytes"] == max(rank["peak_bytes"] for rank in report["ranks"]) > 0
    # Each rank counts its own batches' tokens; TRL's tokens/s is the whole job's, so the two add up to it (same clock).
    later = [report for report in progress if report["tokens_per_s"] is not None]
    assert later and all(rank["tokens_per_s"] > 0 for report in later for rank in report["ranks"])
    for report in later:
        assert sum(rank["tokens_per_s"] for rank in report["ranks"]) == pytest.approx(report["tokens_per_s"], rel=1e-6)
    metrics, memory = result["metrics"], result["memory"]
    peaks = [metrics[f"rank{rank}_peak_bytes"] for rank in (0, 1)]
    assert memory["device"] == "cpu" and memory["device_peak_bytes"] == max(peaks) >= progress[-1]["peak_bytes"]
    assert metrics["rank0_tokens_per_s"] > 0 and metrics["rank1_tokens_per_s"] > 0
    # One log, each worker's lines marked by torchrun with its rank (handlers/child/launch.py).
    for rank in (0, 1):
        assert f"[rank{rank}] adapterd child " in log and f"rank {rank} of 2, job " in log
    assert not any(line.startswith("adapterd child ") for line in log.splitlines())  # no worker's line unmarked


def assert_same_losses(sharded: list[float], data_parallel: list[float]) -> None:
    assert len(sharded) == len(data_parallel) == 4
    assert sharded == pytest.approx(data_parallel, rel=LOSS_RTOL)
    assert sharded[-1] < sharded[0]  # it trained


def with_checkpointing(on: bool) -> dict[str, Any]:
    """The helper's training block with gradient checkpointing on or off, as a request says it."""
    return {
        "training": {
            "max_steps": 4,
            "learning_rate": 1e-2,
            "per_device_train_batch_size": 2,
            "gradient_checkpointing": on,
        }
    }


def assert_checkpointed(sharded: dict[str, Any], whole: dict[str, Any]) -> None:
    """The sharded job (`gradient_checkpointing: true`) recomputes its layers' activations in the backward pass and the
    data-parallel one (false) keeps them: the same losses either way (`assert_same_losses`) is checkpointing on a
    sharded model computing what a whole model computes without it."""
    assert sharded["metrics"]["checkpointed_modules"] > 0 and whole["metrics"]["checkpointed_modules"] == 0


@pytest.mark.slow
def test_a_sharded_full_fine_tune_holds_half_per_rank_and_trains_as_data_parallel(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    sharded, sharded_messages = run_two_ranks(
        two_gpu_sft("full-fsdp", tiny_model_dir, "fsdp", peft=None, **with_checkpointing(True)), tmp_path / "fsdp"
    )
    whole, whole_messages = run_two_ranks(
        two_gpu_sft("full-dp", tiny_model_dir, "none", peft=None, **with_checkpointing(False)), tmp_path / "dp"
    )
    assert_checkpointed(sharded, whole)
    for rank in (0, 1):
        # Each rank holds half of every parameter (FSDP2 shards each on its first
        # dimension); data-parallel, all of them.
        assert sharded["metrics"][f"rank{rank}_param_count"] == TINY_PARAMS / 2
        assert sharded["metrics"][f"rank{rank}_param_bytes"] == TINY_PARAMS / 2 * 4  # float32
        assert sharded["metrics"][f"rank{rank}_trainable_param_count"] == TINY_PARAMS / 2
        assert whole["metrics"][f"rank{rank}_param_count"] == TINY_PARAMS
    assert sharded["metrics"]["world_size"] == whole["metrics"]["world_size"] == 2.0
    assert_same_losses(step_losses(sharded_messages), step_losses(whole_messages))
    assert_rank_figures(sharded, sharded_messages, (tmp_path / "fsdp/child.log").read_text())
    assert_rank_figures(whole, whole_messages, (tmp_path / "dp/child.log").read_text())
    # What is pushed is the full model, gathered from the two shards: the data-parallel job's weights. The gather
    # writes the output layer tied to the embeddings as a copy of them, which loading ties again.
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    gathered, replica = (
        load_file(tmp_path / "fsdp/artifact/model.safetensors"),
        load_file(tmp_path / "dp/artifact/model.safetensors"),
    )
    assert set(gathered) - set(replica) <= {"lm_head.weight"}
    assert all(torch.allclose(gathered[name], replica[name], rtol=0, atol=1e-6) for name in replica)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp/artifact")
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    assert torch.allclose(
        loaded.model.embed_tokens.weight.detach(), replica["model.embed_tokens.weight"], rtol=0, atol=1e-6
    )
    # Loaded as users load it, the pushed model gives the logits of the model the data-parallel child trained (whose
    # artifact is its trained model as it was, never sharded), and not the base's.
    assert_same_logits(
        logits_of(tmp_path / "fsdp/artifact"), logits_of(tmp_path / "dp/artifact"), logits_of(tiny_model_dir)
    )


def logits_of(model: Path, adapter: Path | None = None) -> Any:
    """The logits of a model as a user loads it (transformers, with PEFT for an adapter) on a fixed batch of tokens."""
    import torch
    from transformers import AutoModelForCausalLM

    loaded: Any = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        loaded = PeftModel.from_pretrained(loaded, adapter)
    tokens = torch.arange(2 * 12).reshape(2, 12) % loaded.config.vocab_size
    with torch.no_grad():
        return loaded.eval()(input_ids=tokens).logits


def assert_same_logits(pushed: Any, trained: Any, base: Any) -> None:
    import torch

    assert torch.allclose(pushed, trained, rtol=0, atol=1e-5), (pushed - trained).abs().max()
    assert not torch.allclose(pushed, base, rtol=0, atol=1e-3)  # it is the trained model: training moved the logits


@pytest.mark.slow
def test_a_sharded_lora_sft_holds_half_the_base_per_rank_and_trains_as_data_parallel(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    merged = {"output": {"repo_id": "results/lora", "push": "merged"}}
    sharded, sharded_messages = run_two_ranks(
        two_gpu_sft("lora-fsdp", tiny_model_dir, "fsdp", **with_checkpointing(True), **merged), tmp_path / "fsdp"
    )
    whole, whole_messages = run_two_ranks(
        two_gpu_sft("lora-dp", tiny_model_dir, "none", **with_checkpointing(False), **merged), tmp_path / "dp"
    )
    assert_checkpointed(sharded, whole)
    adapter = whole["metrics"]["rank0_trainable_param_count"]
    assert 0 < adapter < TINY_PARAMS / 4
    for rank in (0, 1):
        # The frozen base is sharded, half on each rank; the adapter, attached after the sharding, is whole on each.
        assert sharded["metrics"][f"rank{rank}_param_count"] == TINY_PARAMS / 2 + adapter
        assert sharded["metrics"][f"rank{rank}_trainable_param_count"] == adapter
        assert whole["metrics"][f"rank{rank}_param_count"] == TINY_PARAMS + adapter
    assert_same_losses(step_losses(sharded_messages), step_losses(whole_messages))
    # output.push merged: the adapter merged into the base on the host (handlers/toolkit/distributed/fsdp.py
    # `save_merged`) is the data-parallel job's merge, weight for weight, with nothing of the adapter left beside it.
    import torch
    from safetensors.torch import load_file

    files = {p.name for p in (tmp_path / "fsdp/artifact").iterdir()}
    assert "model.safetensors" in files and not files & {"adapter_model.safetensors", "adapter_config.json"}
    assert not (tmp_path / "fsdp/artifact.adapter").exists()
    gathered, replica = (
        load_file(tmp_path / "fsdp/artifact/model.safetensors"),
        load_file(tmp_path / "dp/artifact/model.safetensors"),
    )
    assert set(gathered) == set(replica)
    assert all(torch.allclose(gathered[name], replica[name], rtol=0, atol=1e-6) for name in replica)
    base = load_file(tiny_model_dir / "model.safetensors")
    assert not torch.allclose(
        gathered["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"]
    )  # merged in


def test_a_sharded_job_runs_on_as_many_processes_as_it_asked_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """The check of handlers/toolkit/distributed/fsdp.py no two-rank run reaches: a child whose process count is not the
    request's GPUs fails in preflight naming resources.shard."""
    from handlers.protocol import JobFailed
    from handlers.toolkit.distributed.fsdp import distributed_config
    from schemas import REQUEST_MODELS

    request = REQUEST_MODELS["sft"].model_validate(sft_request("shard-checks", resources={"gpus": 2, "shard": "fsdp"}))
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(JobFailed) as failed:
        distributed_config(request)
    assert (failed.value.code, failed.value.stage) == ("config_invalid", "preflight")
    assert failed.value.message.startswith(
        "resources.shard: 'fsdp' shards over the job's 2 processes, and this child runs 1"
    )
    assert (
        distributed_config(REQUEST_MODELS["sft"].model_validate(sft_request("unsharded", resources={"gpus": 2})))
        is None
    )


def losses_by_step(messages: list[dict[str, Any]]) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in messages if m["kind"] == "progress" and m.get("loss") is not None}


@pytest.mark.slow
def test_a_sharded_job_stopped_at_a_checkpoint_resumes_on_another_host_at_the_step_after_with_the_losses_of_a_run_never_stopped(  # noqa: E501 (the test's name says what it checks)
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    """A stop (SIGTERM) saves a checkpoint on every rank and ends the job `stopped`, as a data-parallel job's does; the
    checkpoint holds the whole training state (handlers/toolkit/distributed/checkpoints.py: the gathered weights, each
    rank's shard of the optimizer's state in torch distributed checkpoint files, the scheduler's and the random
    generators' states). Taken through the checkpoint store to another host's job folder as the daemon takes it
    (uploaded with its signed manifest, downloaded with names and sizes checked), the next attempt goes on at the step
    after it, and from there its per-step losses are those of the same job never stopped. A large learning rate, so
    that a lost optimizer or scheduler state shows (without the optimizer's, the losses part after the first step)."""
    from daemon.settings import Settings
    from daemon.store.checkpoints import CheckpointStore
    from daemon.store.download import download
    from daemon.store.opening import store_signing
    from tests.helpers import fleet_key

    request = two_gpu_sft(
        "stop-fsdp",
        tiny_model_dir,
        "fsdp",
        peft=None,
        training={"max_steps": 20, "learning_rate": 1e-2, "per_device_train_batch_size": 2},
    )
    returncode, stopped = launch_two_ranks(request, tmp_path / "host-a", stop_at_step=2)
    stops = [m for m in stopped if m["kind"] == "stopped"]
    assert len(stops) == 1 and 2 <= stops[0]["step"] < 18, stopped
    step, checkpoint = stops[0]["step"], Path(stops[0]["path"])
    assert returncode != 0 and not any(m["kind"] == "result" for m in stopped)

    signing = store_signing(Settings(event_signing_key_file=fleet_key(tmp_path / "keys")))
    assert signing is not None
    store = CheckpointStore(str(tmp_path / "store"), {}, host="host-a", signing=signing)
    store.upload("stop-fsdp", checkpoint, step)
    [manifest] = store.complete("stop-fsdp")
    assert {"model.safetensors", "trainer_state.json", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"} <= set(
        manifest.files
    )
    # Each rank's shard of the optimizer's state, in safetensors (no pickle), and nothing else in its folder.
    assert {name for name in manifest.files if name.startswith("sharded/")} == {
        "sharded/shard-00001-model-00001-of-00001.safetensors",
        "sharded/shard-00002-model-00001-of-00001.safetensors",
    }
    download(store, "stop-fsdp", manifest, tmp_path / "host-b" / "checkpoints")

    done, again = run_two_ranks(request, tmp_path / "host-b")
    resumed = losses_by_step(again)
    assert min(resumed) == step + 1 and max(resumed) == 20  # from the step after the checkpoint, not from step 0
    assert done["metrics"]["rank0_param_count"] == TINY_PARAMS / 2  # still sharded
    assert (
        f"sharded: resumed the optimizer and scheduler of {tmp_path / 'host-b'}/checkpoints/checkpoint-{step} "
        f"at step {step}" in (tmp_path / "host-b" / "child.log").read_text()
    )
    _, whole = run_two_ranks(request, tmp_path / "whole")
    never_stopped = losses_by_step(whole)
    assert [resumed[s] for s in sorted(resumed)] == pytest.approx(
        [never_stopped[s] for s in sorted(resumed)], rel=LOSS_RTOL
    )
    assert never_stopped[20] < never_stopped[1]  # it trained
