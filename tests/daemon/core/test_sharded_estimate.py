"""The memory estimate under sharding (daemon/resources/memory.py, `shards`): one GPU's figure when a job's base is
sharded across N GPUs by FSDP2 full-shard, worked out by hand for the tiny model and for Llama-3.1-8B's shapes,
and the tiny model's sharded weights against what each of two ranks holds (tests/handlers/test_sharding.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from daemon.resources.memory import Tensors, estimate, trainable_parameters
from schemas import RequestBase, decode_request
from tests.helpers import sft_request

# Llama-3.1-8B's shapes: 32 blocks, hidden 4096, 32 heads and 8 KV heads of 128, MLP 14336,
# vocabulary 128256, an untied head.
VOCAB, HIDDEN, LAYERS, MLP, KV = 128256, 4096, 32, 14336, 1024
BLOCK = (
    2 * HIDDEN * HIDDEN + 2 * KV * HIDDEN + 3 * MLP * HIDDEN + 2 * HIDDEN
)  # 218,112,000: attention, MLP and two norms
OUTSIDE = 2 * VOCAB * HIDDEN + HIDDEN  # 1,050,677,248: the embedding, the head and the final norm
PARAMS = LAYERS * BLOCK + OUTSIDE  # 8,030,261,248
GIB = 2**30


def llama_8b_header() -> dict[str, Any]:
    header: dict[str, Any] = {
        "model.embed_tokens.weight": {"dtype": "BF16", "shape": [VOCAB, HIDDEN]},
        "lm_head.weight": {"dtype": "BF16", "shape": [VOCAB, HIDDEN]},
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
            "input_layernorm": [HIDDEN],
            "post_attention_layernorm": [HIDDEN],
        }.items():
            header[prefix + name + ".weight"] = {"dtype": "BF16", "shape": shape}
    return header


LLAMA_8B = Tensors.from_headers([llama_8b_header()])


def request(**overrides: Any) -> RequestBase:
    decoded = decode_request(json.dumps(sft_request("m1", **overrides)).encode())
    assert isinstance(decoded, RequestBase), decoded
    return decoded


def test_the_8b_shapes_are_llama_3_1_8b() -> None:
    assert LLAMA_8B.parameters == PARAMS == 8_030_261_248
    assert LLAMA_8B.by_layer == (BLOCK, OUTSIDE) == (218_112_000, 1_050_677_248)


def test_a_full_fine_tune_of_an_8b_model_fits_no_80_gb_gpu_whole_and_eight_sharded_each_hold_an_eighth() -> None:
    full = request(
        model={"id": "meta-llama/Llama-3.1-8B"},
        peft=None,
        sft={"max_length": 2048},
        training={"per_device_train_batch_size": 1},
    )
    whole, sharded = estimate(full, LLAMA_8B), estimate(full, LLAMA_8B, shards=8)
    tokens = 2048
    activations = tokens * HIDDEN * (LAYERS + 17) * 2  # each block's input, and one block's activations (checkpointing)
    logits = tokens * VOCAB * 2
    assert whole.parts == {
        "weights": 2 * PARAMS,
        "trainable": 8 * PARAMS,
        "activations": activations,
        "logits": logits,
        "generation": 0,
    }
    assert whole.total == 81_650_032_640  # above an 80 GiB GPU's 77.3 GiB less the 10% headroom
    assert sharded.shards == 8 and sharded.parts == {
        "weights": 2 * PARAMS // 8,  # 2,007,565,312: the bf16 weights' eighth
        "trainable": 8 * PARAMS // 8,  # 8,030,261,248: the gradient and AdamW's state, an eighth of each
        "activations": activations,
        "logits": logits,
        "generation": 0,  # per device batch: unchanged
        "gathered": (2 * BLOCK + OUTSIDE)
        * 2,  # 2,973,802,496: a block, the next (prefetched), the embedding, head and norm, whole
        "unsharded_gradients": (BLOCK + OUTSIDE) * 2,  # 2,537,578,496: their gradients, whole until reduce-scattered
    }
    assert sharded.total == 16_896_627_712  # 16.9 GB a GPU


def test_lora_on_an_8b_model_shards_the_base_and_keeps_the_adapter_and_its_optimizer_whole_on_every_rank() -> None:
    lora = request(model={"id": "meta-llama/Llama-3.1-8B"}, peft={"r": 16, "target_modules": ["q_proj", "v_proj"]})
    whole, sharded = estimate(lora, LLAMA_8B), estimate(lora, LLAMA_8B, shards=4)
    adapter = 16 * LAYERS * ((HIDDEN + HIDDEN) + (HIDDEN + KV))  # r × (in + out) of q_proj and v_proj in every block
    assert trainable_parameters(lora, LLAMA_8B) == adapter == 6_815_744
    assert sharded.parts["weights"] == 2 * PARAMS // 4 == whole.parts["weights"] // 4
    assert (
        sharded.parts["trainable"] == whole.parts["trainable"] == 16 * adapter
    )  # fp32 adapter, gradient, two moments: whole
    assert sharded.parts["gathered"] == (2 * BLOCK + OUTSIDE) * 2
    assert "unsharded_gradients" not in sharded.parts  # the base is frozen: no gradient of it to reduce-scatter
    assert {key: sharded.parts[key] for key in ("activations", "logits", "generation")} == {
        key: whole.parts[key] for key in ("activations", "logits", "generation")
    }
    # A reference model is loaded whole beside the sharded base.
    beside = estimate(lora, LLAMA_8B, [LLAMA_8B], shards=4)
    assert beside.parts["weights"] == 2 * PARAMS // 4 + 2 * PARAMS


def test_a_full_dpo_counts_trls_copy_of_the_base_whole_on_every_rank_and_lora_none() -> None:
    """A full fine-tune's reference is a second copy of the base TRL loads whole (test_sharding's DPO test measures each
    rank holding it: rank<r>_ref_param_count); with LoRA the reference is the policy, adapter off; precomputed
    reference log-probs need no copy either."""

    def dpo(**overrides: Any) -> RequestBase:
        return request(
            method="dpo", model={"id": "meta-llama/Llama-3.1-8B"}, dataset={"id": "tiny/preferences"}, **overrides
        )

    full = estimate(dpo(peft=None), LLAMA_8B, shards=8)
    assert full.parts["weights"] == 2 * PARAMS // 8 + 2 * PARAMS
    assert estimate(dpo(peft=None), LLAMA_8B).parts["weights"] == 2 * 2 * PARAMS  # unsharded too: policy and reference
    assert (
        estimate(dpo(peft=None, dpo={"precompute_ref_log_probs": True}), LLAMA_8B, shards=8).parts["weights"]
        == 2 * PARAMS // 8
    )
    assert estimate(dpo(), LLAMA_8B, shards=8).parts["weights"] == 2 * PARAMS // 8


def test_what_fits_where_is_what_the_estimator_says() -> None:
    """docs/what-fits.md is what `python -m benchmarks.what_fits` prints from the estimate
    (regenerate it so after a change)."""
    from benchmarks.what_fits import render

    assert (Path(__file__).parents[3] / "docs" / "what-fits.md").read_text() == render(), (
        "run `python -m benchmarks.what_fits > docs/what-fits.md`"
    )
    assert (
        "| Llama-3.1-8B | 8.0B | full fine-tune | 81.7 GB does not fit | 16.9 GB fits |" in render()
    )  # test_a_full_fine_tune_of_an_8b_model...
