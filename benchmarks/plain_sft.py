"""The plain alternative: the same SFT LoRA job as the daemon runs, as a script that calls TRL directly.

`python -m benchmarks.plain_sft SPEC_JSON` reads the request the daemon would get and prints TRL's
training metrics as one JSON line. The arguments are built exactly as `handlers.sft` builds them.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer


def main(request_path: str) -> None:
    request = json.loads(Path(request_path).read_text())
    model_dir = request["model"]["id"]
    dtype = request["model"].get("dtype", "auto")  # as handlers.loading.model_kwargs reads it
    with tempfile.TemporaryDirectory() as output_dir:
        config = SFTConfig(
            logging_steps=1, save_strategy="steps", save_total_limit=2, **request["training"],
            output_dir=output_dir, report_to="none", use_cpu=not torch.cuda.is_available(), disable_tqdm=True,
        )
        trainer = SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype if dtype == "auto" else getattr(torch, dtype)),
            args=config,
            train_dataset=Dataset.from_list(request["dataset"]["rows"]),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            peft_config=LoraConfig(task_type="CAUSAL_LM", **request["peft"]),
        )
        metrics = trainer.train().metrics
        trainer.save_model(str(Path(output_dir) / "artifact"))
    print(json.dumps(metrics))


if __name__ == "__main__":
    main(sys.argv[1])
