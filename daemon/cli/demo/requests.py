"""The requests `adapterd demo --method NAME` submits: each method's example
(`schemas/examples/<method>.json`) on the demo's tiny local model, with a small LoRA, a few steps
and a few inline rows of the columns that method reads. Its method block and reward functions stay
as the example writes them, but for generation lengths shortened for the CPU. `sft-vision`,
`dpo-vision` and `grpo-vision` run the vision-language examples on a tiny vision-language model,
with rows whose images are small coloured squares, inline as base64 data. `grpo-math` runs GRPO's
example on a tiny set of sums made here, scored by TRL's accuracy reward (math-verify) against each
row's solution."""

from __future__ import annotations

import base64
import io
import json
import time
from pathlib import Path
from typing import Any

from PIL import Image

import schemas
from schemas import RequestBase, decode_request
from schemas.methods import METHODS
from schemas.request import REQUEST_MODELS

VISION_SUFFIX = "-vision"
MATH_DEMO = "grpo-math"

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
    for row in PREFERENCE_ROWS
    for column in ("chosen", "rejected")
]
PROMPT_ROWS = [
    {"prompt": "Two plus two equals", "answer": "four"},
    {"prompt": "Three plus five equals", "answer": "eight"},
    {"prompt": "The capital of France is", "answer": "Paris"},
    {"prompt": "Kafka keeps the", "answer": "requests"},
]


def square(rgb: tuple[int, int, int], size: int = 32) -> str:
    """A square of one colour, as an inline image: a PNG in a base64 data URI."""
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), rgb).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


COLOURS = {"red": (220, 30, 30), "green": (30, 200, 60), "blue": (40, 60, 220), "yellow": (230, 220, 40)}


def _asks(question: str) -> list[dict[str, Any]]:
    """A user turn showing one image, then asking about it."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


def _says(text: str) -> list[dict[str, Any]]:
    return [{"role": "assistant", "content": [{"type": "text", "text": text}]}]


VISION_CHAT_ROWS = [
    {"messages": _asks("What colour is this square?") + _says(f"The square is {name}."), "images": [square(rgb)]}
    for name, rgb in COLOURS.items()
]
VISION_PREFERENCE_ROWS = [
    {
        "prompt": _asks("What colour is this square?"),
        "chosen": _says(f"It is {name}."),
        "rejected": _says("yes no yes"),
        "images": [square(rgb)],
    }
    for name, rgb in COLOURS.items()
]
VISION_PROMPT_ROWS = [
    {"prompt": _asks("What colour is this square?"), "image": square(rgb), "answer": name}
    for name, rgb in COLOURS.items()
]
# `grpo-math`'s rows: sums with their solutions in LaTeX, as math datasets write them.
MATH_ROWS = [
    {"prompt": f"What is {a} plus {b}? Put the answer in \\boxed{{}}.", "solution": f"${a + b}$"}
    for a, b in [(2, 3), (7, 5), (12, 30), (9, 9), (4, 16), (21, 21), (6, 1), (13, 8)]
]
# TRL's accuracy reward on the solution column; a little of TRL's repetition penalty, which the tiny
# model's answers vary in (all of them wrong at first: an all-equal reward would give GRPO no advantage).
MATH_REWARDS = {
    "functions": [{"name": "accuracy", "column": "solution"}, {"name": "repetition_penalty", "weight": 0.1}]
}

ROWS = {
    "sft": CHAT_ROWS,
    "dpo": PREFERENCE_ROWS,
    "orpo": PREFERENCE_ROWS,
    "cpo": PREFERENCE_ROWS,
    "gkd": CHAT_ROWS,
    "online_dpo": PROMPT_ROWS,
    "reward": PREFERENCE_ROWS,
    "kto": LABELLED_ROWS,
    "grpo": PROMPT_ROWS,
    "rloo": PROMPT_ROWS,
    "ppo": PROMPT_ROWS,
    "distillation": PROMPT_ROWS,
    "sft-vision": VISION_CHAT_ROWS,
    "dpo-vision": VISION_PREFERENCE_ROWS,
    "grpo-vision": VISION_PROMPT_ROWS,
    MATH_DEMO: MATH_ROWS,
}
# Generation on the CPU: 4 completions of 16 tokens per prompt (the examples ask for 64).
SHORT_GENERATION = {
    "grpo": {"num_generations": 4, "max_completion_length": 16},
    "rloo": {"num_generations": 4, "max_completion_length": 16},
    "ppo": {"response_length": 16},
    "distillation": {"max_completion_length": 16},
    "gkd": {"max_new_tokens": 16},
    "online_dpo": {"max_new_tokens": 16},
}


def teacher_dir(model_dir: Path) -> Path:
    """The distillation demo's teacher: the tiny model from another seed, beside it (the demo builds it)."""
    return model_dir.parent / "tiny-teacher"


def nan_model_dir(model_dir: Path) -> Path:
    """The gate demo's failing run's model: the tiny model with its final norm's weight NaN
    (`python -m handlers.fixtures.tiny_model DIR --nan`), beside it (the demo builds it)."""
    return model_dir.parent / "tiny-nan-model"


def demo_request(name: str, model_dir: Path) -> RequestBase:
    """The demo's request for `name` (a method, or a method's vision-language demo: `sft-vision`); a
    fresh request id each run, so each run trains."""
    request: dict[str, Any] = json.loads(
        (EXAMPLES_DIR / f"{method_of(name) if name == MATH_DEMO else name}.json").read_text()
    )
    method = request["method"]
    if name == MATH_DEMO:
        request["rewards"] = MATH_REWARDS
    request.update(
        request_id=f"demo-{name}-{time.strftime('%Y%m%d-%H%M%S')}",
        model={"id": str(model_dir)},
        dataset={"rows": ROWS[name]},
        peft={"r": 4, "lora_alpha": 8, "lora_dropout": 0.0},
        training={"max_steps": 10, "learning_rate": 5e-3, "per_device_train_batch_size": 4, "logging_steps": 1},
        output={"repo_id": f"demo/tiny-{name}-adapter", "push": "adapter"},
        metadata={"source": "adapterd demo"},
    )
    if method in SHORT_GENERATION:
        request[method] = {**request.get(method, {}), **SHORT_GENERATION[method]}
    if "rewards" in request:
        request["rewards"].pop("model", None)  # the example's reward model is a Hub repo; its functions suffice
    if "reward_model" in request:
        request["reward_model"] = {"id": str(model_dir)}  # PPO needs one: the tiny model, its score head untrained
    if "teacher_model" in request:
        request["teacher_model"] = {"id": str(teacher_dir(model_dir))}
    decoded = decode_request(json.dumps(request).encode())
    if not isinstance(decoded, RequestBase):
        raise ValueError(f"the demo's {name} request is invalid: {decoded.errors}")
    return decoded


# The gate of `adapterd demo --gate`: the adapter's loss on the demo's rows no worse than the base
# model's, and every logged loss finite; a failure goes to a pull request (on the demo's local sink, a
# folder of its own beside main's).
DEMO_GATE = {"gate": [{"metric": "eval_loss", "at_most": 1.0, "of": "base"}], "on_fail": "pr"}


def gated_demo_requests(model_dir: Path) -> list[RequestBase]:
    """`adapterd demo --gate`: the SFT demo judged by DEMO_GATE, as trained (it passes: to main), and
    the same request on the tiny model poisoned with NaN (`nan_model_dir`): every loss it logs is
    NaN, so it fails both rules, by construction and on any CPU, and goes to a pull request. (A
    learning rate of 1e4 used to stand in for the failure: on some CPUs it ends in NaN, on others in
    a flat, finite loss that may pass; issue 36.)"""
    requests = []
    for name, model in (("passes", model_dir), ("fails", nan_model_dir(model_dir))):
        base = demo_request("sft", model).model_dump(mode="json", exclude_unset=True)
        base.update(
            request_id=f"{base['request_id']}-{name}",
            dataset={"rows": CHAT_ROWS, "eval": {"rows": CHAT_ROWS}},
            output={**base["output"], "repo_id": "demo/tiny-sft-gated-adapter"},
            evaluation=DEMO_GATE,
        )
        decoded = decode_request(json.dumps(base).encode())
        if not isinstance(decoded, RequestBase):
            raise ValueError(f"the demo's gated request is invalid: {decoded.errors}")
        requests.append(decoded)
    return requests


def known_methods() -> list[str]:
    """What the demo runs: every method, the vision-language demo of each method that has one, and GRPO on math."""
    return [*REQUEST_MODELS, *(f"{name}{VISION_SUFFIX}" for name, row in METHODS.items() if row.vision), MATH_DEMO]


def method_of(name: str) -> str:
    """The method a demo trains: `grpo` for `grpo-vision` and `grpo-math`."""
    return "grpo" if name == MATH_DEMO else name.removesuffix(VISION_SUFFIX)


def is_vision(name: str) -> bool:
    return name.endswith(VISION_SUFFIX)
