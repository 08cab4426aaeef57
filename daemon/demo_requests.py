"""The requests `adapterd demo --method NAME` submits: each method's README example
(`schemas/examples/<method>.json`) on the demo's tiny local model, with a small LoRA, a few steps
and a few inline rows of the columns that method reads. Its method block and reward functions stay
as the example writes them, but for generation lengths shortened for the CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import schemas
from schemas import RequestBase, decode_request
from schemas.request import REQUEST_MODELS

EXAMPLES_DIR = Path(schemas.__file__).parent / "examples"

CHAT_ROWS = [
    {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}
    for q, a in [
        ("What is the capital of France?", "The capital of France is Paris."),
        ("What is two plus two?", "Two plus two equals four."),
        ("What does adapterd do?", "adapterd trains adapters from a stream of requests."),
        ("Where are the requests kept?", "Kafka keeps the requests."),
        ("Where are the adapters kept?", "The Hub keeps the adapters."),
        ("What is three plus five?", "Three plus five equals eight."),
        ("Is the fox quick?", "yes, the quick brown fox jumps over the lazy dog."),
        ("Is the dog lazy?", "yes, the dog is lazy."),
    ]
]
PREFERENCE_ROWS = [
    {"prompt": "What is two plus two?", "chosen": "Two plus two equals four.", "rejected": "yes no yes no"},
    {"prompt": "Where are the requests kept?", "chosen": "Kafka keeps the requests.", "rejected": "the dog is lazy"},
    {"prompt": "What is the capital of France?", "chosen": "The capital of France is Paris.", "rejected": "eight"},
    {"prompt": "Where are the adapters kept?", "chosen": "The Hub keeps the adapters.", "rejected": "no"},
]
LABELLED_ROWS = [
    {"prompt": row["prompt"], "completion": row[column], "label": column == "chosen"}
    for row in PREFERENCE_ROWS for column in ("chosen", "rejected")
]
PROMPT_ROWS = [
    {"prompt": "Two plus two equals", "answer": "four"},
    {"prompt": "Three plus five equals", "answer": "eight"},
    {"prompt": "The capital of France is", "answer": "Paris"},
    {"prompt": "Kafka keeps the", "answer": "requests"},
]
ROWS = {
    "sft": CHAT_ROWS, "dpo": PREFERENCE_ROWS, "orpo": PREFERENCE_ROWS, "reward": PREFERENCE_ROWS,
    "kto": LABELLED_ROWS, "grpo": PROMPT_ROWS, "rloo": PROMPT_ROWS, "ppo": PROMPT_ROWS,
}
# Generation on the CPU: 4 completions of 16 tokens per prompt (the examples ask for 64).
SHORT_GENERATION = {
    "grpo": {"num_generations": 4, "max_completion_length": 16},
    "rloo": {"num_generations": 4, "max_completion_length": 16},
    "ppo": {"response_length": 16},
}


def demo_request(method: str, model_dir: Path) -> RequestBase:
    """The demo's request for `method`; a fresh request id each run, so each run trains."""
    request: dict[str, Any] = json.loads((EXAMPLES_DIR / f"{method}.json").read_text())
    request.update(
        request_id=f"demo-{method}-{time.strftime('%Y%m%d-%H%M%S')}",
        model={"id": str(model_dir)},
        dataset={"rows": ROWS[method]},
        peft={"r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        training={"max_steps": 10, "learning_rate": 5e-3, "per_device_train_batch_size": 4, "logging_steps": 1},
        output={"repo_id": f"demo/tiny-{method}-adapter", "push": "adapter"},
        metadata={"source": "adapterd demo"},
    )
    if method in SHORT_GENERATION:
        request[method] = {**request.get(method, {}), **SHORT_GENERATION[method]}
    if "rewards" in request:
        request["rewards"].pop("model", None)  # the example's reward model is a Hub repo; its functions suffice
    if "reward_model" in request:
        request["reward_model"] = {"id": str(model_dir)}  # PPO needs one: the tiny model, its score head untrained
    decoded = decode_request(json.dumps(request).encode())
    if not isinstance(decoded, RequestBase):
        raise ValueError(f"the demo's {method} request is invalid: {decoded.errors}")
    return decoded


def known_methods() -> list[str]:
    return list(REQUEST_MODELS)
