"""The plain alternative: the same SFT LoRA job as the daemon runs, as a script that calls TRL directly.

`python -m benchmarks.plain_sft REQUEST_JSON` reads the request the daemon would get and prints TRL's
training metrics as one JSON line. The arguments are built exactly as `handlers.methods.sft` builds them.
`--serve` runs one job per request path read on stdin, in the same process (benchmarks.overhead).
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

from handlers.toolkit.callbacks import StepClock


def train(request: dict) -> dict[str, float]:
    """One job, built exactly as `handlers.methods.sft` builds it; TRL's training metrics, and the median
    step time measured as the daemon's child measures it (`StepClock`, a timer and nothing else)."""
    model_dir = request["model"]["id"]
    dtype = request["model"].get("dtype", "auto")  # as handlers.toolkit.loading.model_kwargs reads it
    with tempfile.TemporaryDirectory() as output_dir:
        config = SFTConfig(
            logging_steps=1,
            save_strategy="steps",
            save_total_limit=2,
            **request["training"],
            output_dir=output_dir,
            report_to="none",
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=True,
        )
        trainer = SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=dtype if dtype == "auto" else getattr(torch, dtype)
            ),
            args=config,
            train_dataset=Dataset.from_list(request["dataset"]["rows"]),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            peft_config=LoraConfig(task_type="CAUSAL_LM", **request["peft"]),
            callbacks=[clock := StepClock()],
        )
        metrics = {**trainer.train().metrics, "median_step_s": clock.median_step_s()}
        trainer.save_model(str(Path(output_dir) / "artifact"))
    return metrics


def main(argv: list[str]) -> None:
    if argv[0] != "--serve":
        print(json.dumps(train(json.loads(Path(argv[0]).read_text()))))
        return
    # Kept running by the overhead benchmark, so its pairs pay the imports once: one request path a
    # line on stdin, one `RESULT {metrics}` line on stdout for each.
    for line in sys.stdin:
        metrics = train(json.loads(Path(line.strip()).read_text()))
        print("RESULT " + json.dumps(metrics), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
