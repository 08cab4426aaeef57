"""A job's GPU memory, estimated before it starts: from its request and the headers of its models'
weights (safetensors headers give every tensor's dtype and shape without the weights), corrected by
what earlier jobs of the same model and method measured (`MemoryHistory`).

The estimate is of the allocator's peak (`torch.cuda.max_memory_allocated`), in parts:

- `weights`: every model the job loads (the base; a reference, teacher or reward model), at the
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

It is a model of the memory, not a measurement: what a job measured (`succeeded.memory`) is kept by
model and method, and the next estimate for them is scaled by the largest ratio seen
(daemon/jobs/estimator.py, which also reads the headers for a request's models).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.common import AdapterdError

DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
               "F8_E4M3": 1, "F8_E5M2": 1}
LOAD_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit on a header
# Per token and hidden unit (or vocabulary entry), in values of the model's dtype: Korthikanti et al.'s
# 34 bytes of a 16-bit layer are 17 values.
ACTIVATION_VALUES = 17  # a layer's activations kept for the backward pass
CHECKPOINT_VALUES = 1  # with gradient checkpointing: a layer's input
LOGIT_VALUES = 1  # the logits (the loss's float32 upcast is taken in pieces; the history corrects the rest)
PEFT_DEFAULT_TARGETS = frozenset({"q_proj", "v_proj"})  # PEFT's default for Llama- and Qwen-like models
_LAYER = re.compile(r"\.layers?\.(\d+)\.|\.h\.(\d+)\.")


class WeightsUnreadable(AdapterdError, ValueError):
    """A model's safetensors headers could not be read (no such files, a header too large or not JSON)."""


@dataclass(frozen=True)
class Tensors:
    """What a model's safetensors headers say: each tensor's dtype and shape."""

    shapes: Mapping[str, tuple[str, tuple[int, ...]]]

    @classmethod
    def from_headers(cls, headers: Iterable[Mapping[str, Any]]) -> Tensors:
        shapes = {}
        for header in headers:
            for name, info in header.items():
                if name != "__metadata__" and isinstance(info, Mapping):
                    shapes[name] = (str(info["dtype"]), tuple(int(size) for size in info["shape"]))
        return cls(shapes)

    @property
    def parameters(self) -> int:
        return sum(_count(shape) for _, shape in self.shapes.values())

    def stored_bytes(self) -> int:
        return sum(_count(shape) * DTYPE_BYTES.get(dtype, 2) for dtype, shape in self.shapes.values())

    def linear(self) -> list[tuple[str, int, int]]:
        """The linear layers inside the model's blocks: (module name, out features, in features)."""
        found = []
        for name, (_, shape) in self.shapes.items():
            if name.endswith(".weight") and len(shape) == 2 and _LAYER.search(name):
                found.append((name.removesuffix(".weight").rsplit(".", 1)[-1], shape[0], shape[1]))
        return found

    @property
    def layers(self) -> int:
        return len({next(g for g in match.groups() if g is not None) for name in self.shapes if (match := _LAYER.search(name))}) or 1

    @property
    def embedding(self) -> tuple[int, int]:
        """(vocabulary, hidden) of the token embedding: the largest 2-D tensor outside the blocks."""
        outside = [shape for name, (_, shape) in self.shapes.items() if len(shape) == 2 and not _LAYER.search(name)]
        if not outside:
            raise WeightsUnreadable("no token embedding among the weights")
        vocab, hidden = max(outside, key=_count)
        return vocab, hidden


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def read_header(path: Path) -> dict[str, Any]:
    """One safetensors file's header: 8 bytes of little-endian length, then that much JSON."""
    with path.open("rb") as file:
        prefix = file.read(8)
        if len(prefix) != 8:
            raise WeightsUnreadable(f"{path.name}: shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise WeightsUnreadable(f"{path.name}: a header of {length} bytes")
        try:
            return dict(json.loads(file.read(length)))
        except ValueError as exc:
            raise WeightsUnreadable(f"{path.name}: its header is not JSON") from exc


def local_tensors(folder: Path) -> Tensors:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise WeightsUnreadable(f"no safetensors files in {folder}")
    return Tensors.from_headers(read_header(path) for path in files)


@dataclass(frozen=True)
class Estimate:
    """A job's estimated allocator peak, in bytes, and its parts (see the module's docstring)."""

    parts: dict[str, int]
    gradient_checkpointing: bool
    scale: float = 1.0  # the largest measured/estimated ratio of earlier jobs of its model and method (`MemoryHistory`)

    @property
    def total(self) -> int:
        """The model's figure, before the history's scale."""
        return sum(self.parts.values())

    @property
    def needed(self) -> int:
        """What the job is taken to need: the model's figure scaled by what was measured."""
        return int(self.total * self.scale)


def _method_block(request: Any) -> Any:
    return getattr(request, request.method, None)


def step_tokens(request: Any) -> int:
    """The tokens of one training step on one device: batch × length, for what the method feeds."""
    block = _method_block(request)
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
    kv_width = sum(out for name, out, _ in tensors.linear() if name in {"k_proj", "v_proj"}) // tensors.layers
    _, hidden = tensors.embedding
    return step_tokens(request) * tensors.layers * (kv_width or 2 * hidden) * dtype_bytes


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
    return sum(rank * (out + inp) for name, out, inp in tensors.linear() if chosen is None or name in chosen)


def estimate(request: Any, base: Tensors, others: Iterable[Tensors] = (), *, gradient_checkpointing: bool = True) -> Estimate:
    """The allocator peak of `request`'s job on one device, from its base model's tensors and those
    of the other models it loads (`others`)."""
    stored = base.stored_bytes() // max(base.parameters, 1) or 2
    dtype_bytes = LOAD_BYTES.get(request.model.dtype, stored)
    linear = sum(out * inp for _, out, inp in base.linear())
    if request.model.quantization == "4bit":
        weights = (base.parameters - linear) * dtype_bytes + linear // 2
    elif request.model.quantization == "8bit":
        weights = (base.parameters - linear) * dtype_bytes + linear
    else:
        weights = base.parameters * dtype_bytes
    weights += sum(other.parameters * dtype_bytes for other in others)
    trainable = trainable_parameters(request, base)
    trainable_bytes = trainable * (16 if request.peft is not None else 4 * dtype_bytes)
    tokens = step_tokens(request)
    vocab, hidden = base.embedding
    layers = base.layers
    if gradient_checkpointing:
        activations = tokens * hidden * (CHECKPOINT_VALUES * layers + ACTIVATION_VALUES) * dtype_bytes
    else:
        activations = tokens * hidden * ACTIVATION_VALUES * layers * dtype_bytes
    parts = {
        "weights": weights, "trainable": trainable_bytes, "activations": activations,
        "logits": tokens * vocab * LOGIT_VALUES * dtype_bytes, "generation": generation_bytes(request, base, dtype_bytes),
    }
    return Estimate(parts, gradient_checkpointing)
