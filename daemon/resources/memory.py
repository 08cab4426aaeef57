"""A job's GPU memory, estimated before it starts: from its request and the headers of its models'
weights (safetensors headers give every tensor's dtype and shape without the weights), corrected by
what earlier jobs of the same model and method measured (`MemoryHistory`).

The estimate is of the allocator's peak (`torch.cuda.max_memory_allocated`), in parts:

- `weights`: every model the job loads (the base; a reference, teacher or reward model; the copy of
  the base TRL loads as a full fine-tune's reference, `copies_base_as_reference`), at the
  dtype it is loaded in; a 4-bit base keeps its linear layers in half a byte a weight, 8-bit in one;
- `trainable`: LoRA's A and B for every targeted linear layer (r × (in + out) each), or every
  parameter of a full fine-tune, each with its gradient and AdamW's two moments: PEFT keeps adapters
  in float32 (16 bytes a parameter); a full fine-tune keeps all four at the model's dtype;
- `activations`: the tokens of one step (batch × length; × 2 for a preference pair; × the
  generations of an online method) × hidden × layers × 17 values of the model's dtype without
  gradient checkpointing (Korthikanti et al. 2022's 34 bytes at 16 bits, with attention kernels that
  keep no s² scores), and with it one value a layer for the checkpoints plus one layer's 17;
- `logits`: the step's tokens × vocabulary, one value each;
- `generation` (GRPO, RLOO, online DPO): the KV cache of the sequences generated at once.

Sharded across N GPUs (`shards`, FSDP2 full-shard as handlers/toolkit/distributed/fsdp.py applies it), the
figure is one GPU's: the base's `weights` divided by N, and a full fine-tune's `trainable` state
(gradients, AdamW's moments) divided by N; a LoRA adapter and its optimizer state stay whole on every
rank (PEFT attaches them after the sharding: what the sharded tests measured), and so do the other
models: a reference model, the request's or the copy of the base TRL loads for a full fine-tune's KL term
(`copies_base_as_reference`), is whole on every rank (never trained, it is not sharded), as is a reward
model. `activations`, `logits` and `generation` are per device
batch, unchanged. Sharding adds, as measured on two ranks' allocator timelines (the peak is in the
loss's backward, tests/handlers/test_sharded_memory.py):

- `gathered`: the full parameters FSDP2 all-gathers for compute: two of the largest block's (the block
  computing and the next, which FSDP2 prefetches in the backward pass) and every parameter outside the
  blocks, counted whole although this rank's shard of them is already in `weights` (an upper bound by 1/N).
  transformers' `fsdp_plan` keeps the embedding and final norm gathered from forward through backward
  in one unit, and FSDP2 keeps its root unit (the head) gathered likewise; a head tied to the embedding
  (no head among the headers) is gathered by both units, so it is counted twice;
- `unsharded_gradients` (a full fine-tune): the gradients of a gathered unit are whole until its
  reduce-scatter, and the root's (the embedding's and the head's) from the head's backward to the end of
  the backward pass: the largest block's and every parameter outside the blocks, at the model's dtype.

It is a model of the memory, not a measurement: what a job measured (`succeeded.memory`) is kept by
model and method, and the next estimate for them is scaled by the largest ratio seen
(daemon/resources/estimator.py, which also reads the headers for a request's models).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from schemas.common import AdapterdError
from schemas.request import ReferencedRequest

DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
}
LOAD_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# Per token and hidden unit (or vocabulary entry), in values of the model's dtype: Korthikanti et al.'s
# 34 bytes of a 16-bit layer are 17 values.
ACTIVATION_VALUES = 17  # a layer's activations kept for the backward pass
CHECKPOINT_VALUES = 1  # with gradient checkpointing: a layer's input
LOGIT_VALUES = 1  # the logits (the loss's float32 upcast is taken in pieces; the history corrects the rest)
PEFT_DEFAULT_TARGETS = frozenset({"q_proj", "v_proj"})  # PEFT's default for Llama- and Qwen-like models
# A tensor (and a model) of more values than this is no model's: 2**48 values is 256 TiB at one byte
# each, a thousand times the largest GPU's memory. Refused as unreadable, so that an estimate is never
# negative nor too large for a float (a 4,000-digit dimension once raised OverflowError; issue 46).
MAX_VALUES = 2**48
MAX_RANK = 8
_LAYER = re.compile(r"\.layers?\.(\d+)\.|\.h\.(\d+)\.")


class WeightsUnreadable(AdapterdError, ValueError):
    """A model's safetensors headers could not be read (no such files, a header too large or not JSON,
    a read past its deadline) or say something no model is (a negative or absurd dimension)."""


@dataclass(frozen=True)
class Tensors:
    """What a model's safetensors headers say: each tensor's dtype and shape. What the estimate asks
    of them is worked out once (cached properties), in the thread that read them
    (daemon/resources/estimator.py), so that an estimate from known tensors is quick on the event loop."""

    shapes: Mapping[str, tuple[str, tuple[int, ...]]]

    @classmethod
    def from_headers(cls, headers: Iterable[Mapping[str, Any]]) -> Tensors:
        shapes = {}
        for header in headers:
            for name, info in header.items():
                if name != "__metadata__" and isinstance(info, Mapping):
                    shapes[name] = _tensor(name, info)
        tensors = cls(shapes)
        if tensors.parameters == 0:
            raise WeightsUnreadable("no weights: the headers name no tensor with any values")
        if tensors.parameters > MAX_VALUES:
            raise WeightsUnreadable(f"{_size(tensors.parameters)} parameters, beyond any GPU's memory")
        return tensors

    def warm(self) -> Tensors:
        """Work out now what the estimate asks of them (raises WeightsUnreadable without an embedding)."""
        _ = self.parameters, self.stored, self.linear_sums, self.layers, self.embedding, self.by_layer, self.tied_head
        return self

    @cached_property
    def parameters(self) -> int:
        return sum(_count(shape) for _, shape in self.shapes.values())

    @cached_property
    def stored(self) -> int:
        return sum(_count(shape) * DTYPE_BYTES.get(dtype, 2) for dtype, shape in self.shapes.values())

    def stored_bytes(self) -> int:
        return self.stored

    def linear(self) -> list[tuple[str, int, int]]:
        """The linear layers inside the model's blocks: (module name, out features, in features)."""
        found = []
        for name, (_, shape) in self.shapes.items():
            if name.endswith(".weight") and len(shape) == 2 and _LAYER.search(name):
                found.append((name.removesuffix(".weight").rsplit(".", 1)[-1], shape[0], shape[1]))
        return found

    @cached_property
    def linear_sums(self) -> dict[str, tuple[int, int, int]]:
        """By module name (q_proj, ...), over the blocks: (Σ out, Σ (out + in), Σ out × in)."""
        sums: dict[str, tuple[int, int, int]] = {}
        for name, out, inp in self.linear():
            outs, sides, products = sums.get(name, (0, 0, 0))
            sums[name] = (outs + out, sides + out + inp, products + out * inp)
        return sums

    @cached_property
    def layers(self) -> int:
        return (
            len(
                {
                    next(g for g in match.groups() if g is not None)
                    for name in self.shapes
                    if (match := _LAYER.search(name))
                }
            )
            or 1
        )

    @cached_property
    def by_layer(self) -> tuple[int, int]:
        """(the largest block's parameters, the parameters outside the blocks): what FSDP2 gathers."""
        blocks: dict[str, int] = {}
        outside = 0
        for name, (_, shape) in self.shapes.items():
            match = _LAYER.search(name)
            if match is None:
                outside += _count(shape)
            else:
                block = next(g for g in match.groups() if g is not None)
                blocks[block] = blocks.get(block, 0) + _count(shape)
        return max(blocks.values(), default=0), outside

    @cached_property
    def tied_head(self) -> bool:
        """Whether the output head is the token embedding: no second tensor of the
        embedding's shape outside the blocks."""
        vocab, hidden = self.embedding
        return (
            sum(1 for name, (_, shape) in self.shapes.items() if shape == (vocab, hidden) and not _LAYER.search(name))
            < 2
        )

    @cached_property
    def embedding(self) -> tuple[int, int]:
        """(vocabulary, hidden) of the token embedding: the largest 2-D tensor outside the blocks."""
        outside = [shape for name, (_, shape) in self.shapes.items() if len(shape) == 2 and not _LAYER.search(name)]
        if not outside:
            raise WeightsUnreadable("no token embedding among the weights")
        vocab, hidden = max(outside, key=_count)
        if vocab == 0 or hidden == 0:
            raise WeightsUnreadable(f"a token embedding of shape ({vocab}, {hidden})")
        return vocab, hidden


def _size(value: int) -> str:
    """A size for a message: a number of 4,000 digits is said by its digits' count, not written out."""
    digits = len(str(value)) if value.bit_length() < 10_000 else int(value.bit_length() * 0.30103) + 1
    return str(value) if digits <= 24 else f"a number of {digits} digits"


def _tensor(name: str, info: Mapping[str, Any]) -> tuple[str, tuple[int, ...]]:
    """One tensor's dtype and shape, refused (WeightsUnreadable) unless a tensor could be so: a shape
    of at most MAX_RANK whole numbers, none negative, none and their product not beyond MAX_VALUES."""
    label = repr(name[:80])
    dtype, shape = info.get("dtype"), info.get("shape")
    if not isinstance(dtype, str):
        raise WeightsUnreadable(f"tensor {label}: its dtype is not a string")
    if not isinstance(shape, list) or len(shape) > MAX_RANK:
        raise WeightsUnreadable(f"tensor {label}: its shape is not a list of at most {MAX_RANK} dimensions")
    for size in shape:
        if type(size) is not int:  # bool is an int to Python, never to safetensors
            raise WeightsUnreadable(f"tensor {label}: a dimension that is not a whole number ({str(size)[:40]})")
        if size < 0:
            raise WeightsUnreadable(f"tensor {label}: a negative dimension ({_size(size)})")
        if size > MAX_VALUES:
            raise WeightsUnreadable(f"tensor {label}: a dimension of {_size(size)}, beyond any GPU's memory")
    dimensions = tuple(shape)
    if _count(dimensions) > MAX_VALUES:
        raise WeightsUnreadable(f"tensor {label}: {_size(_count(dimensions))} values, beyond any GPU's memory")
    return dtype, dimensions


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


@dataclass(frozen=True)
class Estimate:
    """A job's estimated allocator peak, in bytes, and its parts (see the module's docstring)."""

    parts: dict[str, int]
    gradient_checkpointing: bool
    scale: float = 1.0  # the largest measured/estimated ratio of earlier jobs of its model and method (`MemoryHistory`)
    shards: int = 1  # the GPUs the base is sharded across (1: a whole copy on the GPU); the figure is one GPU's

    @property
    def total(self) -> int:
        """The model's figure, before the history's scale."""
        return sum(self.parts.values())

    @property
    def needed(self) -> int:
        """What the job is taken to need: the model's figure scaled by what was measured."""
        return int(self.total * self.scale)


def step_tokens(request: Any) -> int:
    """The tokens of one training step on one device: batch × length, for what the method feeds."""
    block = request.method_config  # each TRL config class has its own lengths: read where it has them
    batch = request.training.per_device_train_batch_size or 8  # TrainingArguments' default
    length = getattr(block, "max_length", None) or 1024  # TRL's default for SFT, DPO, KTO, ORPO, CPO, reward
    if request.method in {"dpo", "orpo", "cpo", "reward"}:
        return batch * 2 * length  # each row is a chosen and a rejected sequence
    if request.method in {"grpo", "rloo", "online_dpo"}:
        prompt = getattr(block, "max_prompt_length", None) or 512
        completion = getattr(block, "max_completion_length", None) or 256
        return batch * (prompt + completion)  # the generations are the batch: batch counts completions
    return batch * length


def generation_bytes(request: Any, tensors: Tensors, dtype_bytes: int) -> int:
    """The KV cache of an online method's generations: every sequence of a step at once."""
    if request.method not in {"grpo", "rloo", "online_dpo"}:
        return 0
    kv_width = (
        sum(outs for name, (outs, _, _) in tensors.linear_sums.items() if name in {"k_proj", "v_proj"})
        // tensors.layers
    )
    _, hidden = tensors.embedding
    return step_tokens(request) * tensors.layers * (kv_width or 2 * hidden) * dtype_bytes


def copies_base_as_reference(request: Any) -> bool:
    """Whether TRL loads a second copy of the base as the frozen reference: a full fine-tune (no adapter to switch
        off) of DPO or KTO without a `ref_model` and without `precompute_ref_log_probs` (which computes the reference's
        log-probs with the policy before it trains), or of GRPO or RLOO with a KL term (`beta` above 0). TRL loads it
    from the base's folder as a whole model (`create_model_from_path`), on every rank of a sharded job too."""
    if request.peft is not None or (isinstance(request, ReferencedRequest) and request.ref_model is not None):
        return False
    block = request.method_config  # DPO's, KTO's, GRPO's or RLOO's TRL config: the fields read below are theirs
    if request.method in {"dpo", "kto"}:
        return not getattr(block, "precompute_ref_log_probs", None)
    if request.method in {"grpo", "rloo"}:
        beta = getattr(block, "beta", None)
        return (
            bool(beta) if beta is not None else request.method == "rloo"
        )  # TRL's defaults: GRPO's beta 0, RLOO's 0.05
    return False


def trainable_parameters(request: Any, tensors: Tensors) -> int:
    peft = request.peft
    if peft is None:
        return tensors.parameters
    rank = peft.r or 8
    targets = peft.target_modules
    if targets is None:
        chosen = PEFT_DEFAULT_TARGETS
    elif isinstance(targets, str):
        chosen = None  # "all-linear" or a pattern: every linear layer, an upper bound
    else:
        chosen = frozenset(targets)
    return sum(rank * sides for name, (_, sides, _) in tensors.linear_sums.items() if chosen is None or name in chosen)


def estimate(
    request: Any,
    base: Tensors,
    others: Iterable[Tensors] = (),
    *,
    gradient_checkpointing: bool = True,
    shards: int = 1,
) -> Estimate:
    """The allocator peak of `request`'s job on one device, from its base model's tensors and those
    of the other models it loads (`others`); with `shards` above 1, on one of the GPUs its base is
    sharded across (the module's docstring)."""
    stored = base.stored // max(base.parameters, 1) or 2
    dtype_bytes = LOAD_BYTES.get(request.model.dtype, stored)
    linear = sum(products for _, _, products in base.linear_sums.values())
    if request.model.quantization == "4bit":
        weights = (base.parameters - linear) * dtype_bytes + linear // 2
    elif request.model.quantization == "8bit":
        weights = (base.parameters - linear) * dtype_bytes + linear
    else:
        weights = base.parameters * dtype_bytes
    trainable = trainable_parameters(request, base)
    trainable_bytes = trainable * (16 if request.peft is not None else 4 * dtype_bytes)
    sharding: dict[str, int] = {}
    if shards > 1:
        weights = -(-weights // shards)  # each rank's shard, rounded up
        largest_block, outside = base.by_layer
        vocab, hidden = base.embedding
        # A tied head is one tensor in the headers and two gathered copies: the embedding's unit's and the root's.
        sharding["gathered"] = (2 * largest_block + outside + (vocab * hidden if base.tied_head else 0)) * dtype_bytes
        if request.peft is None:  # a full fine-tune's gradients and optimizer state are sharded with the weights...
            trainable_bytes = -(-trainable_bytes // shards)
            # ...once reduce-scattered: until then a gathered unit's gradients are whole.
            sharding["unsharded_gradients"] = (largest_block + outside) * dtype_bytes
    weights += sum(other.parameters * dtype_bytes for other in others)
    if copies_base_as_reference(request):  # whole on every rank, sharded or not (handlers/methods/dpo.py)
        weights += base.parameters * dtype_bytes
    tokens = step_tokens(request)
    vocab, hidden = base.embedding
    layers = base.layers
    if gradient_checkpointing:
        activations = tokens * hidden * (CHECKPOINT_VALUES * layers + ACTIVATION_VALUES) * dtype_bytes
    else:
        activations = tokens * hidden * ACTIVATION_VALUES * layers * dtype_bytes
    parts = {
        "weights": weights,
        "trainable": trainable_bytes,
        "activations": activations,
        "logits": tokens * vocab * LOGIT_VALUES * dtype_bytes,
        "generation": generation_bytes(request, base, dtype_bytes),
    }
    parts.update(sharding)
    return Estimate(parts, gradient_checkpointing, shards=max(shards, 1))
