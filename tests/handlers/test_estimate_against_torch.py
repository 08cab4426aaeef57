"""The memory estimate (daemon/resources/memory.py) against the tiny model as torch and PEFT build it: the
weights it reads from the safetensors headers are the parameters torch counts, on one GPU and per rank of two
(what tests/handlers/test_sharding.py measures each rank holding), and the LoRA adapter is the one PEFT attaches.
Apart from tests/daemon/core because it loads the training stack (seconds), which the core's fakes never do."""

from __future__ import annotations

from pathlib import Path

from daemon.resources.headers import local_tensors
from daemon.resources.memory import estimate, trainable_parameters
from tests.daemon.core.test_memory_estimate import request as one_gpu_request
from tests.daemon.core.test_sharded_estimate import LLAMA_8B, request
from tests.handlers.test_sharding import TINY_PARAMS


def test_the_tiny_models_weights_part_is_its_parameters_as_torch_counts_them(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tensors = local_tensors(tiny_model_dir)
    stored = {name for name in tensors.shapes}
    # Tied embeddings are stored once; torch's count is of unique parameters too.
    assert tensors.parameters == sum(parameter.numel() for parameter in model.parameters()), stored
    assert (
        estimate(one_gpu_request(model={"id": str(tiny_model_dir), "dtype": "float32"}), tensors).parts["weights"]
        == 4 * tensors.parameters
    )


def test_the_tiny_models_sharded_figure_is_what_each_of_two_ranks_holds(tiny_model_dir: Path) -> None:
    """Per rank, the estimate's weights are the bytes the sharded tests measure each rank holding (rank<r>_param_bytes,
    tests/handlers/test_sharding.py), exactly as the one-GPU figure is torch's count (above);
    and the LoRA adapter each rank holds whole is the one PEFT attaches."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    tensors = local_tensors(tiny_model_dir)
    assert tensors.parameters == TINY_PARAMS
    assert tensors.by_layer == (
        9_344,
        10_272,
    )  # a block of hidden 32, MLP 64, KV 16, q/k/v biases; the 320 × 32 embedding and the norm
    full = estimate(request(model={"id": str(tiny_model_dir), "dtype": "float32"}, peft=None), tensors, shards=2)
    assert (
        full.parts["weights"] == TINY_PARAMS // 2 * 4 == 57_920
    )  # test_sharding: rank<r>_param_bytes == TINY_PARAMS / 2 * 4
    assert full.parts["trainable"] == TINY_PARAMS * 4 * 4 // 2
    assert tensors.tied_head and not LLAMA_8B.tied_head  # the tiny model's head is its embedding; Llama's is its own
    # The tied embedding gathered twice (the embedding's unit's copy and the root's, measured in
    # tests/handlers/test_sharded_memory.py).
    assert full.parts["gathered"] == (2 * 9_344 + 10_272 + 320 * 32) * 4
    assert full.parts["unsharded_gradients"] == (9_344 + 10_272) * 4
    # A full DPO: each rank's shard of the policy and TRL's reference whole (test_sharding: rank<r>_param_count
    # TINY_PARAMS / 2 and rank<r>_ref_param_count TINY_PARAMS, float32).
    dpo = request(
        method="dpo",
        model={"id": str(tiny_model_dir), "dtype": "float32"},
        dataset={"id": "tiny/preferences"},
        peft=None,
    )
    assert estimate(dpo, tensors, shards=2).parts["weights"] == TINY_PARAMS // 2 * 4 + TINY_PARAMS * 4
    lora = request(model={"id": str(tiny_model_dir), "dtype": "float32"})  # the helper's LoRA: r 4, all-linear
    sharded = estimate(lora, tensors, shards=2)
    assert sharded.parts["weights"] == 57_920
    peft = lora.peft
    assert peft is not None
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), LoraConfig(r=peft.r, target_modules=peft.target_modules)
    )
    attached = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    assert trainable_parameters(lora, tensors) == attached == 4_096  # whole on each rank: rank<r>_trainable_param_count
    assert sharded.parts["trainable"] == 16 * attached
