"""What the tests and the benchmarks publish to the local Hub and send the daemon: the token the
daemon is given, the repository ids the tiny model and datasets are published under, chat rows,
and safetensors files of headers alone (models for the memory estimate, without their weights)."""

from __future__ import annotations

import json
import struct
from typing import Any

from daemon.cli.demo.requests import CHAT_ROWS as DEMO_CHAT_ROWS

HUB_TOKEN = "hf_adapterd_test_token"
TINY_MODEL = "tiny/qwen2-chat"
CHAT_DATASET = "tiny/chat-rows"
PREFERENCE_DATASET = "tiny/preferences"

# The demo's chat rows (daemon/cli/demo/requests.py), said once, but for two: the tests' counts and
# splits were written for these six.
CHAT_ROWS = [row for index, row in enumerate(DEMO_CHAT_ROWS) if index not in (2, 6)]


DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_header_only(header: dict[str, Any]) -> bytes:
    """A safetensors file of `header` alone, without the weights it describes: what reading the
    header for the memory estimate needs (daemon/resources/headers.py), at a few bytes a tensor. Each
    tensor gets the `data_offsets` safetensors writes (huggingface_hub's parser asks for them);
    a shape no tensor has (a test's negative dimension) gets none to speak of."""
    offset, described = 0, {}
    for name, info in header.items():
        if name == "__metadata__":
            described[name] = info
            continue
        size = DTYPE_BYTES.get(info.get("dtype"), 2)
        for dimension in info.get("shape", []):
            size *= dimension if isinstance(dimension, int) and 0 <= dimension < 2**64 else 0
        described[name] = {**info, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(described).encode()
    return struct.pack("<Q", len(raw)) + raw


def sharded_safetensors(header: dict[str, Any], shards: int) -> dict[str, bytes]:
    """A model's files as transformers saves a sharded one: `header`'s tensors spread over `shards`
    files (headers only) and model.safetensors.index.json naming each tensor's file."""
    names = sorted(name for name in header if name != "__metadata__")
    files: dict[str, bytes] = {}
    weight_map: dict[str, str] = {}
    for index in range(shards):
        shard = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
        part = {name: header[name] for name in names[index::shards]}
        weight_map.update(dict.fromkeys(part, shard))
        files[shard] = safetensors_header_only({"__metadata__": {"format": "pt"}, **part})
    files["model.safetensors.index.json"] = json.dumps(
        {"metadata": {"total_size": 0}, "weight_map": weight_map}
    ).encode()
    return files
