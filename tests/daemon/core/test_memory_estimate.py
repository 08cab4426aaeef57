"""The memory estimate (daemon/resources/memory.py): what it reads from a model's safetensors headers, how
each part moves with what the request says, hostile headers, and the measured history that scales it."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import pytest

from daemon.resources.estimator import MemoryHistory
from daemon.resources.headers import local_tensors, read_header
from daemon.resources.memory import Tensors, WeightsUnreadable, estimate
from schemas import RequestBase, decode_request
from tests.helpers import sft_request

# Qwen2-0.5B's shapes: 24 blocks, hidden 896, 14 heads and 2 KV heads of 64, MLP 4864,
# vocabulary 151936, tied embedding.
VOCAB, HIDDEN, LAYERS, MLP, KV = 151936, 896, 24, 4864, 128


def qwen2_0_5b_header() -> dict[str, Any]:
    header: dict[str, Any] = {
        "__metadata__": {"format": "pt"},
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [VOCAB, HIDDEN]},
        "model.norm.weight": {"dtype": "BF16", "shape": [HIDDEN]},
    }
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        for name, shape in {
            "self_attn.q_proj": [HIDDEN, HIDDEN],
            "self_attn.k_proj": [KV, HIDDEN],
            "self_attn.v_proj": [KV, HIDDEN],
            "self_attn.o_proj": [HIDDEN, HIDDEN],
            "mlp.gate_proj": [MLP, HIDDEN],
            "mlp.up_proj": [MLP, HIDDEN],
            "mlp.down_proj": [HIDDEN, MLP],
        }.items():
            header[prefix + name + ".weight"] = {"dtype": "BF16", "shape": shape}
        for bias, width in {"self_attn.q_proj": HIDDEN, "self_attn.k_proj": KV, "self_attn.v_proj": KV}.items():
            header[prefix + bias + ".bias"] = {"dtype": "BF16", "shape": [width]}
        header[prefix + "input_layernorm.weight"] = {"dtype": "BF16", "shape": [HIDDEN]}
        header[prefix + "post_attention_layernorm.weight"] = {"dtype": "BF16", "shape": [HIDDEN]}
    return header


QWEN = Tensors.from_headers([qwen2_0_5b_header()])


def request(method: str = "sft", **overrides: Any) -> RequestBase:
    document = sft_request("m1", **overrides)
    document["method"] = method
    decoded = decode_request(json.dumps(document).encode())
    assert isinstance(decoded, RequestBase), decoded
    return decoded


def test_the_headers_give_the_models_shape() -> None:
    assert 490e6 < QWEN.parameters < 500e6  # Qwen2-0.5B: 494M parameters
    assert QWEN.layers == LAYERS and QWEN.embedding == (VOCAB, HIDDEN)
    assert {name for name, _, _ in QWEN.linear()} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert QWEN.stored_bytes() == 2 * QWEN.parameters


def test_a_typical_lora_job_on_a_0_5b_model_is_a_few_gigabytes_and_each_part_is_what_the_request_says() -> None:
    job = request(
        peft={"r": 16, "target_modules": "all-linear"},
        training={"per_device_train_batch_size": 8},
        sft={"max_length": 1024},
    )
    found = estimate(job, QWEN)
    assert found.parts["weights"] == 2 * QWEN.parameters  # bf16 as stored
    per_layer = 16 * ((HIDDEN + HIDDEN) * 2 + (KV + HIDDEN) * 2 + (MLP + HIDDEN) * 3)
    assert found.parts["trainable"] == 16 * LAYERS * per_layer  # fp32 adapter, gradient and two moments
    assert found.parts["logits"] == 8 * 1024 * VOCAB * 2 and found.parts["generation"] == 0
    assert 3e9 < found.total < 6e9  # the H200 measured 3.2 GB for such a job (batch 8 x ~980 tokens): an upper estimate
    without = estimate(job, QWEN, gradient_checkpointing=False)
    tokens = 8 * 1024
    assert found.parts["activations"] == tokens * HIDDEN * (
        2 * LAYERS + 34
    )  # each layer's input, and one layer's activations
    assert without.parts["activations"] == tokens * HIDDEN * 34 * LAYERS
    assert {key: value for key, value in without.parts.items() if key != "activations"} == {
        key: value for key, value in found.parts.items() if key != "activations"
    }


def test_the_parts_follow_targets_rank_quantization_pairs_generations_and_full_fine_tuning() -> None:
    peft_default = estimate(request(peft={"r": 16, "target_modules": None}), QWEN).parts["trainable"]
    assert peft_default == 16 * 16 * LAYERS * (
        (HIDDEN + HIDDEN) + (KV + HIDDEN)
    )  # PEFT's own choice for the model: q_proj and v_proj
    assert estimate(request(peft={"r": 32, "target_modules": None}), QWEN).parts["trainable"] == 2 * peft_default
    assert (
        estimate(request(peft={"r": 16, "target_modules": ["q_proj", "v_proj"]}), QWEN).parts["trainable"]
        == peft_default
    )
    assert (
        estimate(request(peft={"r": 16}), QWEN).parts["trainable"] > 6 * peft_default
    )  # the request's default: all-linear
    four_bit = estimate(request(model={"id": "tiny/qwen2-chat", "quantization": "4bit"}, peft={"r": 16}), QWEN).parts[
        "weights"
    ]
    assert four_bit < 0.5 * estimate(request(peft={"r": 16}), QWEN).parts["weights"]
    full = estimate(request(peft=None), QWEN)
    assert full.parts["trainable"] == 4 * 2 * QWEN.parameters  # weights, gradient and two moments at bf16
    as_float32 = estimate(request(model={"id": "tiny/qwen2-chat", "dtype": "float32"}), QWEN)
    assert as_float32.parts["weights"] == 4 * QWEN.parameters
    sft = estimate(request(), QWEN).parts["logits"]
    assert estimate(request("dpo", dpo={"max_length": 1024}), QWEN).parts["logits"] == 2 * sft  # chosen and rejected
    with_reference = estimate(request("dpo"), QWEN, [QWEN])
    assert with_reference.parts["weights"] == 2 * estimate(request("dpo"), QWEN).parts["weights"]


def test_an_online_method_counts_its_generations_kv_cache() -> None:
    grpo = request("grpo", grpo={"max_completion_length": 256}, rewards={"functions": [{"name": "think_format"}]})
    found = estimate(grpo, QWEN)
    assert found.parts["generation"] == 2 * (512 + 256) * LAYERS * 2 * KV * 2  # batch 2 in the helper's request


def write_safetensors(path: Path, header: dict[str, Any], length: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw)


def test_a_local_folder_is_read_from_its_headers_alone_and_a_hostile_header_is_refused(tmp_path: Path) -> None:
    header = qwen2_0_5b_header()
    names = sorted(header)
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", {name: header[name] for name in names[: len(names) // 2]}
    )
    write_safetensors(
        tmp_path / "model-00002-of-00002.safetensors", {name: header[name] for name in names[len(names) // 2 :]}
    )
    assert local_tensors(tmp_path) == QWEN  # two shards, no weights on disk: the headers are all it reads
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    write_safetensors(hostile / "model.safetensors", {}, length=2**40)  # claims a terabyte of header
    with pytest.raises(WeightsUnreadable, match="a header of"):
        read_header(hostile / "model.safetensors")
    (hostile / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{nope")
    with pytest.raises(WeightsUnreadable, match="not JSON"):
        read_header(hostile / "model.safetensors")
    with pytest.raises(WeightsUnreadable, match="no safetensors"):
        local_tensors(tmp_path / "missing")


def test_the_history_scales_later_estimates_by_what_was_measured_and_survives_a_restart(tmp_path: Path) -> None:
    history = MemoryHistory.load(tmp_path / "memory.json")
    assert history.scale("m", "sft") == 1.0
    history.learn("m", "sft", estimated=1000, measured=1500)
    history.learn("m", "sft", estimated=1000, measured=800)  # under the estimate: never scales it down
    again = MemoryHistory.load(tmp_path / "memory.json")
    assert again.scale("m", "sft") == 1.5 and again.scale("m", "dpo") == 1.0
    (tmp_path / "memory.json").write_text("[not a mapping")
    assert MemoryHistory.load(tmp_path / "memory.json").ratios == {}


async def test_a_model_whose_headers_cannot_be_read_is_unknown_and_not_asked_again_at_once(tmp_path: Path) -> None:
    from daemon.resources.estimator import Estimator
    from daemon.settings import Settings

    estimator = Estimator(Settings(work_dir=tmp_path, hub_token=None), MemoryHistory.load(tmp_path / "memory.json"))
    reads: list[str] = []

    async def unreadable(model_id: str, revision: str | None, deadline: object) -> Tensors:
        reads.append(model_id)
        raise WeightsUnreadable("no safetensors files")

    estimator.read = unreadable  # type: ignore[method-assign]
    job = request(model={"id": str(tmp_path / "missing")})
    assert await estimator.need(job) is None and await estimator.need(job) is None
    assert reads == [str(tmp_path / "missing")]  # the second job did not wait on it again
    assert estimator.known(job) == (True, None)  # and the offer knows it at once
    header = qwen2_0_5b_header()
    write_safetensors(tmp_path / "model.safetensors", header)
    fresh = Estimator(Settings(work_dir=tmp_path, hub_token=None), MemoryHistory.load(tmp_path / "memory.json"))
    found = await fresh.need(request(model={"id": str(tmp_path)}))
    assert found is not None and found.parts["weights"] == 2 * QWEN.parameters and found.scale == 1.0
