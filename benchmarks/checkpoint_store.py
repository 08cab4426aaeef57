"""What the checkpoint store costs a job: the demo's SFT job (the tiny model, LoRA r 4, batch 4) saving
a checkpoint at every step, trained once without a store and once with each checkpoint uploaded to an
S3 server on the loopback (moto's) as the daemon does it: hard-linked aside, then uploaded with its
manifest by another process (the daemon is not the trainer's process), while training goes on.

`python -m benchmarks.checkpoint_store [--steps N]` prints one JSON object: the median step time
without and with uploads (a step that saves included), the median save and upload times of one
checkpoint and its bytes, and save + upload of one checkpoint in a row (what a stop with a deadline
waits for). The loopback S3 server says nothing about a network's bandwidth: docs/guarantees.md does
that arithmetic for a 7B adapter.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

# Set before the s3 client is made, in this process and the uploader's (which inherits it).
os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"})


@functools.cache
def fleet_signing() -> Any:
    """A key of the uploader's own, made once: the manifest is signed as the daemon signs
    it (any key costs the same)."""
    from daemon.store.documents import StoreSigning
    from schemas.signing import EventKeys, EventSigner, new_key_pair, read_private_key

    signer = EventSigner(read_private_key(new_key_pair()[0]))
    return StoreSigning(signer, EventKeys([signer.public]))


def upload(url: str, options: dict[str, Any], folder: str, step: int) -> tuple[float, int]:
    """In the uploader process: one checkpoint's files and its signed manifest; its seconds and bytes."""
    from daemon.store.checkpoints import CheckpointStore

    signing = fleet_signing()
    started = time.perf_counter()
    manifest = CheckpointStore(url, options, signing=signing).upload("bench", Path(folder), step)
    return time.perf_counter() - started, sum(size for size, _ in manifest.files.values())


def train(model_dir: Path, steps: int, store: tuple[str, dict[str, Any]] | None) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    from daemon.cli.demo.requests import demo_request
    from daemon.job.uploads import snapshot

    request = demo_request("sft", model_dir)
    pool = ProcessPoolExecutor(1) if store is not None else None
    uploads: list[Future[tuple[float, int]]] = []
    step_s: list[float] = []
    save_s: list[float] = []

    class Clock(TrainerCallback):
        last = 0.0
        step_end = 0.0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.last:
                step_s.append(time.perf_counter() - self.last)  # the step before, its save (and hand-off) included
            self.last = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_end = time.perf_counter()

        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            save_s.append(time.perf_counter() - self.step_end)
            if pool is not None and store is not None:
                folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
                copy = snapshot(folder, Path(args.output_dir) / "uploading" / folder.name)
                uploads.append(pool.submit(upload, store[0], store[1], str(copy), state.global_step))

    with tempfile.TemporaryDirectory() as output_dir:
        config = SFTConfig(
            **{**request.training.model_dump(exclude_none=True), "max_steps": steps},
            save_strategy="steps",
            save_steps=1,
            output_dir=output_dir,
            report_to="none",
            use_cpu=not torch.cuda.is_available(),
            disable_tqdm=True,
        )
        rows = [row if isinstance(row, dict) else row.model_dump() for row in request.dataset.rows or []]
        trainer = SFTTrainer(
            model=AutoModelForCausalLM.from_pretrained(str(model_dir)),
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=AutoTokenizer.from_pretrained(str(model_dir)),
            peft_config=LoraConfig(task_type="CAUSAL_LM", r=4, lora_alpha=8, lora_dropout=0.0),
            callbacks=[Clock()],
        )
        trainer.train()
        done = [future.result() for future in uploads]
        if pool is not None:
            pool.shutdown()
    result: dict[str, Any] = {
        "median_step_s": round(statistics.median(step_s), 4),
        "median_save_s": round(statistics.median(save_s), 4),
    }
    if done:
        upload_s = statistics.median(seconds for seconds, _ in done)
        result.update(
            uploads=len(done),
            median_upload_s=round(upload_s, 4),
            checkpoint_bytes=done[-1][1],
            save_and_upload_s=round(statistics.median(save_s) + upload_s, 4),
        )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2, help="runs without and with the store, alternated")
    args = parser.parse_args()
    from benchmarks.soak import s3_server
    from handlers.fixtures.tiny_model import save_tiny_model

    with s3_server("bench") as endpoint, tempfile.TemporaryDirectory() as folder:
        model_dir = save_tiny_model(Path(folder) / "tiny-model")
        store = ("s3://bench/checkpoints", {"s3": {"client_kwargs": {"endpoint_url": endpoint}}})
        runs = [
            train(model_dir, args.steps, store if index % 2 else None) for index in range(2 * args.rounds)
        ]  # alternated
    without = [run for index, run in enumerate(runs) if index % 2 == 0]
    with_store = [run for index, run in enumerate(runs) if index % 2]
    print(
        json.dumps(
            {"steps": args.steps, "saves": "every step", "without_store": without, "with_store": with_store}, indent=2
        )
    )


if __name__ == "__main__":
    main()
