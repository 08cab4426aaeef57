"""`python -m benchmarks.memory_estimate`: the memory estimate (daemon/resources/memory.py) against what a
job measures, on the CPU, for models large enough that their memory stands out of the interpreter's.

Each row trains one SFT LoRA job of a Qwen2-shaped model with random float32 weights (built here,
nothing downloaded) for a few steps, in a fresh interpreter: the measured figure is the peak resident
set of that process less its resident set once torch, transformers and TRL are imported, the model
not yet loaded. The estimate is computed from the same model's safetensors headers and the same
request. On a GPU the job's own figure is torch's allocator peak (succeeded.memory); the CPU's
allocator and the process's other memory (the loaded state dict, the dataset, the trainer) make the
ratio of the totals no test of the estimate; what the rows of one model add to its first row (a
larger batch, checkpointing off) is the activations' and logits' share, and is compared. The
constants are calibrated on a GPU by the measured history.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

SHAPES = {
    "30M": {
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_hidden_layers": 6,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
    },
    "110M": {
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "num_key_value_heads": 4,
    },
}
VOCAB = 32000
LENGTH = 256


def build(out_dir: Path, shape: dict[str, int]) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from handlers.fixtures.tiny_model import build_tokenizer

    tokenizer = build_tokenizer()
    tokenizer.add_tokens([f"<|pad{i}|>" for i in range(VOCAB - len(tokenizer))])
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **shape,
    )
    Qwen2ForCausalLM(config).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def request(model_dir: Path, batch: int, checkpointing: bool) -> dict[str, Any]:
    from handlers.fixtures.tiny_model import CORPUS

    text = " ".join(CORPUS * 40)
    rows = [
        {"messages": [{"role": "user", "content": text[index:]}, {"role": "assistant", "content": text}]}
        for index in range(batch * 3)
    ]
    return {
        "schema_version": 1,
        "request_id": "estimate",
        "method": "sft",
        "model": {"id": str(model_dir), "dtype": "float32"},
        "dataset": {"rows": rows},
        "sft": {"max_length": LENGTH},
        "peft": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.0, "target_modules": "all-linear"},
        "training": {
            "max_steps": 2,
            "per_device_train_batch_size": batch,
            "gradient_checkpointing": checkpointing,
            "learning_rate": 1e-4,
        },
        "output": {"repo_id": "bench/estimate"},
    }


def measure(request_path: Path) -> int:
    """In this interpreter: the job's peak resident set above the one after the imports, in bytes."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    job = json.loads(request_path.read_text())
    torch.set_num_threads(2)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    with tempfile.TemporaryDirectory() as output:
        config = SFTConfig(
            output_dir=output,
            report_to="none",
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
            max_length=LENGTH,
            **job["training"],
        )
        model_dir = job["model"]["id"]
        SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
            args=config,
            train_dataset=Dataset.from_list(job["dataset"]["rows"]),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            peft_config=LoraConfig(task_type="CAUSAL_LM", **{k: v for k, v in job["peft"].items()}),
        ).train()
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before


def main() -> None:
    from daemon.resources.headers import local_tensors
    from daemon.resources.memory import estimate
    from schemas import RequestBase, decode_request

    mib = 2**20
    print(
        f"{'model':>6} {'batch':>5} {'ckpt':>5} {'estimate MiB':>12} {'measured MiB':>12} {'ratio':>6} "
        f"{'est. - first':>12} {'meas. - first':>13}  parts (MiB)"
    )
    with tempfile.TemporaryDirectory() as scratch:
        for name, shape in SHAPES.items():
            model_dir = Path(scratch, name)
            build(model_dir, shape)
            tensors = local_tensors(model_dir)
            first: tuple[int, int] | None = (
                None  # the model's first row: what the others add to it is the activations' and logits' share
            )
            for batch, checkpointing in [(4, True), (4, False), (8, False)]:
                document = request(model_dir, batch, checkpointing)
                path = Path(scratch, f"{name}-{batch}-{checkpointing}.json")
                path.write_text(json.dumps(document))
                decoded = decode_request(path.read_bytes())
                assert isinstance(decoded, RequestBase), decoded
                found = estimate(decoded, tensors, gradient_checkpointing=checkpointing)
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks.memory_estimate", "--measure", str(path)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
                measured = int(out.strip().splitlines()[-1])
                first = first or (found.total, measured)
                parts = ", ".join(f"{part} {value / mib:.0f}" for part, value in found.parts.items() if value)
                print(
                    f"{name:>6} {batch:>5} {str(checkpointing):>5} {found.total / mib:>12.0f} {measured / mib:>12.0f} "
                    f"{measured / found.total:>6.2f} {(found.total - first[0]) / mib:>12.0f} "
                    f"{(measured - first[1]) / mib:>13.0f}  {parts}",
                    flush=True,
                )


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--measure":
        print(measure(Path(sys.argv[2])))
    else:
        main()
