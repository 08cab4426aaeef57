"""The memory plan (daemon/resources/shards.py), decided on the fakes by the real estimator, its models' tensors
known (Llama-3.1-8B's and a 70B's shapes, tests/daemon/core/test_sharded_estimate.py) on a host of eight 80 GiB
GPUs: a request that leaves `resources.shard` out is sharded without asking when only a shard fits, and its
`accepted` says so; one that fits no GPU even sharded is rejected naming resources.gpus with the numbers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from daemon.resources.memory import Tensors
from daemon.settings import Settings
from handlers.protocol import StageEntered
from tests.core import CoreOnFakes, turns_until
from tests.daemon.core.test_sharded_estimate import LLAMA_8B
from tests.fakes import FakeChildren, FakeRecord, Script
from tests.helpers import sft_request

NO_KIND = {"gpu_kind": None, "min_gpu_memory_gib": None, "hosts": 1}  # a request naming no GPU kind nor hosts

GIB = 2**30
LLAMA = "meta-llama/Llama-3.1-8B"
BIG = "meta-llama/Llama-3.1-70B"


def llama_70b() -> Tensors:
    """Llama-3.1-70B's shapes: 80 blocks, hidden 8192, 8 KV heads of 128, MLP 28672, an
    untied head (70.6B parameters)."""
    vocab, hidden, layers, mlp, kv = 128256, 8192, 80, 28672, 1024
    shapes = {
        "model.embed_tokens.weight": ("BF16", (vocab, hidden)),
        "lm_head.weight": ("BF16", (vocab, hidden)),
        "model.norm.weight": ("BF16", (hidden,)),
    }
    for layer in range(layers):
        for name, shape in {
            "q_proj": (hidden, hidden),
            "k_proj": (kv, hidden),
            "v_proj": (kv, hidden),
            "o_proj": (hidden, hidden),
            "gate_proj": (mlp, hidden),
            "up_proj": (mlp, hidden),
            "down_proj": (hidden, mlp),
            "input_layernorm": (hidden,),
            "post_attention_layernorm": (hidden,),
        }.items():
            shapes[f"model.layers.{layer}.{name}.weight"] = ("BF16", shape)
    return Tensors(shapes)


@pytest.fixture
def core(tmp_path: Path) -> CoreOnFakes:
    # Eight declared GPUs of 80 GiB, 10% headroom: 72 GiB each for jobs (77.3 GB). No packing:
    # the plan needs only the memory.
    settings = Settings(
        gpus=[str(gpu) for gpu in range(8)],
        gpu_memory_bytes=80 * GIB,
        gpu_memory_headroom=0.1,
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        progress_interval_s=0,
    )
    found = CoreOnFakes(settings, children=FakeChildren(Script(messages=[StageEntered(stage="train")], hang=True)))
    found.scheduler.memory._tensors[(LLAMA, None)] = LLAMA_8B.warm()  # as if their headers had been read
    found.scheduler.memory._tensors[(BIG, None)] = llama_70b().warm()
    return found


def full_fine_tune(request_id: str, model: str, **overrides: Any) -> dict[str, Any]:
    return sft_request(
        request_id,
        model={"id": model},
        peft=None,
        sft={"max_length": 2048},
        training={"max_steps": 4, "per_device_train_batch_size": 1},
        **overrides,
    )


async def take(core: CoreOnFakes, record: FakeRecord) -> None:
    await core.intake.take(core.tp, [record])
    await core.partitions.settled(core.tp)


async def test_a_full_fine_tune_of_an_8b_model_that_fits_only_sharded_is_sharded_without_asking_and_accepted_says_so(
    core: CoreOnFakes,
) -> None:
    await take(core, core.record(full_fine_tune("big", LLAMA, resources={"gpus": 8})))  # shard left out: 'auto'
    await turns_until(lambda: bool(core.children.taken) and core.children.taken[0].spec is not None)
    accepted = next(event for event in core.events("big") if event["type"] == "accepted")
    # 81.7 GB for a whole copy (test_sharded_estimate), more than a GPU's 77.3 GB; 16.9 GB a GPU sharded across eight.
    assert accepted["plan"] == "sharded" and accepted["estimate_bytes_per_gpu"] == 16_896_627_712
    spec = core.children.taken[0].spec
    assert spec is not None and spec.request["resources"] == {**NO_KIND, "gpus": 8, "shard": "fsdp"}  # it shards it
    assert core.children.launched == [("0,1,2,3,4,5,6,7", 8)]


async def test_a_job_that_fits_a_gpu_whole_runs_data_parallel_and_accepted_says_so(core: CoreOnFakes) -> None:
    await take(
        core, core.record(sft_request("lora", model={"id": LLAMA}, resources={"gpus": 2}))
    )  # a LoRA adapter: the base fits whole
    await turns_until(lambda: bool(core.children.taken) and core.children.taken[0].spec is not None)
    accepted = next(event for event in core.events("lora") if event["type"] == "accepted")
    assert accepted["plan"] == "data-parallel" and 16e9 < accepted["estimate_bytes_per_gpu"] < 30e9
    spec = core.children.taken[0].spec
    assert spec is not None and spec.request["resources"] == {**NO_KIND, "gpus": 2, "shard": "none"}


async def test_a_job_that_fits_no_gpu_even_sharded_is_rejected_naming_resources_gpus_with_the_numbers(
    core: CoreOnFakes,
) -> None:
    await take(core, core.record(full_fine_tune("huge", BIG, resources={"gpus": 2})))
    await take(
        core, core.record(full_fine_tune("next", LLAMA, resources={"gpus": 8, "shard": "fsdp"}), offset=1)
    )  # read on past it
    rejected = core.events("huge")
    assert [event["type"] for event in rejected] == ["rejected"] and rejected[0]["reason"] == "resources"
    assert rejected[0]["errors"] == [
        {
            "path": "resources.gpus",
            "message": (
                "its memory estimate is 709.3 GB a GPU for a whole copy, 370.1 GB a GPU sharded across its 2 GPUs, and "
                "this host's GPUs hold 77.3 GB each for jobs"
            ),
        }
    ]  # not even across all eight: no hint to ask for more
    assert len(core.dead_letters()) == 1 and not core.children.taken[1:]
    await turns_until(lambda: "accepted" in core.types("next"))


async def test_a_job_that_would_fit_across_more_gpus_or_cannot_shard_is_told_so(core: CoreOnFakes) -> None:
    await take(core, core.record(full_fine_tune("one", LLAMA)))  # one GPU: nothing to shard across
    orpo = sft_request(
        "orpo", method="orpo", model={"id": LLAMA}, peft=None, orpo={"max_length": 1024}, resources={"gpus": 8}
    )
    await take(core, core.record(orpo, offset=1))
    await take(core, core.record(full_fine_tune("none", LLAMA, resources={"gpus": 8, "shard": "none"}), offset=2))
    messages = {request_id: core.events(request_id)[0]["errors"][0] for request_id in ("one", "orpo", "none")}
    assert messages["one"] == {
        "path": "resources.gpus",
        "message": (
            "its memory estimate is 81.7 GB a GPU for a whole copy and this host's GPUs hold 77.3 GB each for jobs; "
            "sharded across this host's 8 GPUs it would need 16.9 GB a GPU: ask for gpus 8 (shard 'auto' or 'fsdp')"
        ),
    }
    assert (
        messages["orpo"]["path"] == "resources.gpus"
        and "it cannot shard: resources.shard: 'fsdp' is offered for " in messages["orpo"]["message"]
    )
    assert (
        "not for method orpo: its trainer is not wired or tested sharded (docs/methods.md)"
        in messages["orpo"]["message"]
    )
    assert messages["none"] == {
        "path": "resources.shard",
        "message": (
            "its memory estimate is 81.7 GB a GPU for a whole copy and this host's GPUs hold 77.3 GB each for jobs; "
            "sharded across its 8 GPUs it would need 16.9 GB a GPU: set shard 'fsdp' or 'auto'"
        ),
    }
    assert not core.children.taken


async def test_a_sharded_jobs_succeeded_reports_one_gpus_estimate_and_its_peak_teaches_the_history_nothing(
    core: CoreOnFakes,
) -> None:
    from handlers.protocol import MemoryUse, TrainResult

    measured = MemoryUse(
        device="cuda", peak_allocated_bytes=20 * GIB, peak_reserved_bytes=21 * GIB, device_peak_bytes=22 * GIB
    )
    result = TrainResult(
        trainer="trl.SFTTrainer/trl.SFTConfig",
        metrics={"train_loss": 1.0},
        base_model_revision=None,
        dataset_fingerprint="f",
        durations_s={"train": 0.1},
        versions={},
        memory=measured,
    )
    core.children.scripts = [Script(messages=[StageEntered(stage="train"), result])]
    await take(core, core.record(full_fine_tune("big", LLAMA, resources={"gpus": 8})))
    await turns_until(lambda: "succeeded" in core.types("big"))
    assert core.events("big")[-1]["memory"]["estimate_bytes"] == 16_896_627_712  # as accepted said: one GPU's, sharded
    # One rank's peak against a sharded figure is no correction of a whole copy's estimate of the model.
    assert core.scheduler.memory.history.ratios == {}
