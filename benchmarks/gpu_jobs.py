"""What the GPU check's rows train and read (benchmarks/gpu_check.py says which run where): the models
of Qwen2.5-0.5B's and Qwen2.5-7B's shape built here and the rows they train on, the requests, reading
the GPU and a child from outside (nvidia-smi, /proc), and the GPU's measured bf16 peak."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

# The shape of Qwen2.5-0.5B (about 494M parameters with tied embeddings).
QWEN2_05B = {
    "vocab_size": 151936,
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}

# The shape of Qwen2.5-7B (about 7.6B parameters): issue 39's "7B-shaped LoRA job".
QWEN2_7B = {
    "vocab_size": 152064,
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
}


# --- what the GPU rows train on ------------------------------------------------------------------


def build_qwen2_05b(out_dir: Path, pad_tokenizer: bool = True, shape: dict[str, Any] | None = None) -> Path:
    """A Qwen2 model of Qwen2.5-0.5B's shape (or `shape`), random weights, saved in bf16 with the tiny
    model's tokenizer, padded to the vocabulary unless `pad_tokenizer` is false. Runs in a child
    interpreter (`--build-model`)."""
    shape = shape or QWEN2_05B
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from handlers.fixtures.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    # Pad the tiny tokenizer to Qwen's 151,936 ids, so every id the model can produce decodes (vLLM
    # samples from all of them; random weights make most of its picks these padding tokens).
    if pad_tokenizer:
        tokenizer.add_tokens([f"<|pad{i}|>" for i in range(shape["vocab_size"] - len(tokenizer))])
    torch.manual_seed(0)
    config = Qwen2Config(**shape, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.set_default_dtype(
        torch.bfloat16
    )  # built in bf16: a 7B model in float32 would take 30 GB of host memory first
    model = Qwen2ForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return out_dir


def long_rows(count: int = 64) -> list[dict[str, Any]]:
    """Chat rows of a few hundred tokens each, so a step of the 0.5B model is GPU work, not overhead."""
    from handlers.fixtures.tiny_model import CORPUS

    rows = []
    for index in range(count):
        text = " ".join(CORPUS[(index + k) % len(CORPUS)] for k in range(12))
        rows.append({"messages": [{"role": "user", "content": text}, {"role": "assistant", "content": text[::-1]}]})
    return rows


def tokens_per_row(model_dir: Path, rows: list[dict[str, Any]]) -> float:
    """Mean tokens of a row as SFT sees it (the chat template applied): samples/s times this is tokens/s."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    lengths = [
        len(tokenizer(tokenizer.apply_chat_template(row["messages"], tokenize=False))["input_ids"]) for row in rows
    ]
    return sum(lengths) / len(lengths)


def sft_request(
    model_dir: Path, request_id: str, steps: int, rows: list[dict[str, Any]], *, quantization: str = "none"
) -> dict[str, Any]:
    model: dict[str, Any] = {"id": str(model_dir), "dtype": "bfloat16"}
    if quantization != "none":
        model["quantization"] = quantization
    return {
        "schema_version": 1,
        "request_id": request_id,
        "method": "sft",
        "model": model,
        "dataset": {"rows": rows},
        "peft": {
            "r": 16,
            "lora_alpha": 32,
            "lora_dropout": 0.0,
            "target_modules": "all-linear",
            "use_rslora": False,
            "use_dora": False,
        },
        "training": {"max_steps": steps, "learning_rate": 1e-4, "per_device_train_batch_size": 8, "bf16": True},
        "output": {"repo_id": f"bench/{request_id}"},
    }


def sharded_request(
    model_dir: Path, request_id: str, steps: int, rows: list[dict[str, Any]], gpus: int
) -> dict[str, Any]:
    """A full fine-tune across `gpus` GPUs, `resources.shard` left to the daemon ('auto'): of Qwen2.5-7B's shape its
    whole copy (bf16 weights, gradients and AdamW's state, about 10 bytes a parameter) is over an 80 GB GPU's room,
    so the daemon shards it (daemon/resources/shards.py), as it would any job that fits only so."""
    request = sft_request(model_dir, request_id, steps, rows)
    request["peft"] = None
    request["training"]["per_device_train_batch_size"] = 2
    request["resources"] = {"gpus": gpus}
    return request


def grpo_request(model_dir: Path, request_id: str, steps: int) -> dict[str, Any]:
    from daemon.cli.demo.requests import PROMPT_ROWS

    example = json.loads((Path(__file__).parents[1] / "schemas" / "examples" / "grpo.json").read_text())
    return {
        **example,
        "request_id": request_id,
        "model": {"id": str(model_dir), "dtype": "bfloat16"},
        "dataset": {"rows": PROMPT_ROWS * 4},
        "peft": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
        "grpo": {
            "num_generations": 4,
            "max_completion_length": 32,
            "beta": 0.0,
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.3,
            "vllm_max_model_length": 512,
        },
        "training": {"max_steps": steps, "learning_rate": 1e-5, "per_device_train_batch_size": 4, "bf16": True},
        "output": {"repo_id": f"bench/{request_id}"},
    }


# --- reading the GPU and a child from outside ---------------------------------------------------


def gpu_used_mib() -> float:
    """Memory used on the job's GPUs (all visible ones), as nvidia-smi reports it."""
    out = subprocess.run(
        ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    used = [float(line) for line in out.split()]
    if visible:
        used = [used[int(i)] for i in visible.split(",") if i.strip().isdigit() and int(i) < len(used)]
    return sum(used)


def gpu_compute_pids() -> set[int]:
    if shutil.which("nvidia-smi") is None:
        return set()
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader,nounits"], capture_output=True, text=True
    ).stdout
    return {int(line) for line in out.split() if line.isdigit()}


def cuda_state(pid: int) -> dict[str, Any]:
    """What a child shows of CUDA from outside: an open /dev/nvidia* file (the driver opened: CUDA or
    NVML initialised), libcuda mapped, a CUDA context (nvidia-smi's compute processes), torch mapped."""
    fds = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            fds += os.readlink(fd).startswith("/dev/nvidia")
        except OSError:
            continue
    maps = Path(f"/proc/{pid}/maps").read_text()
    return {
        "nvidia_fds": fds,
        "libcuda": "libcuda.so" in maps,
        "context": pid in gpu_compute_pids(),
        "torch": "libtorch" in maps,
    }


def untouched(state: dict[str, Any]) -> bool:
    return state["nvidia_fds"] == 0 and not state["context"]


_MATMUL = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
count, began = 0, time.perf_counter()
while time.perf_counter() - began < float(sys.argv[1]):
    a @ b
    count += 1
torch.cuda.synchronize()
print(2 * 8192 ** 3 * count / (time.perf_counter() - began) / 1e12)
"""


def measured_bf16_tflops(seconds: float = 3.0) -> float:
    """The GPU's bf16 matmul throughput as this host measures it (8192-square matmuls for `seconds`),
    in a child interpreter: the denominator of a job's share of the peak."""
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _MATMUL, str(seconds)], check=True, capture_output=True, text=True
    ).stdout
    return float(out.strip().splitlines()[-1])


def lora_flops_per_token(shape: dict[str, Any], checkpointing: bool) -> float:
    """Model FLOPs of one trained token of a LoRA job: 2N forward and 2N for the backward pass's
    activation gradients (the frozen weights get none), and 2N more when checkpointing recomputes the
    forward; N the parameters of the linear layers and the LM head (attention's own FLOPs left out)."""
    hidden, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = hidden * shape["num_key_value_heads"] // shape["num_attention_heads"]
    linear = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter) + hidden * shape["vocab_size"]
    return (6 if checkpointing else 4) * linear
