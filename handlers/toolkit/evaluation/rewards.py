"""The `rewards` suite of a request's evaluation: the model answers each eval row's prompt once,
greedily, and the shipped reward functions (handlers/toolkit/rewards/__init__.py, GRPO's) score the answers.

Called by handlers/toolkit/evaluation/__init__.py for each model it measures (the adapter active on the model, or a
baseline's), so every model answers the same prompts with the same settings.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, PreTrainedTokenizerBase

from handlers.protocol import JobFailed
from handlers.toolkit.loading import resolve_model
from handlers.toolkit.rewards import REWARD_FUNCTIONS, columns_needed
from handlers.toolkit.sources import AnyDataset
from schemas.evaluation import RewardsSuite
from schemas.rewards import RewardModelSpec


def _prompt(row: dict[str, Any], index: int, field: str) -> str | list[dict[str, Any]]:
    """What the model is asked: the row's `prompt` (text or messages), or its `messages` up to the
    last assistant turn."""
    if "prompt" in row:
        return row["prompt"]
    messages = row.get("messages")
    if isinstance(messages, list) and messages:
        return messages[:-1] if messages[-1].get("role") == "assistant" else messages
    raise JobFailed("dataset_invalid", "evaluate", f"{field}: eval row {index} has no `prompt` or `messages` to answer")


def _answer(
    model: Any, tokenizer: PreTrainedTokenizerBase, prompt: str | list[dict[str, Any]], max_new_tokens: int
) -> str:
    if isinstance(prompt, list):
        encoded: Any = tokenizer.apply_chat_template(
            prompt, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
    else:
        encoded = tokenizer(prompt, return_tensors="pt")
    inputs = {k: v.to(model.device) for k, v in encoded.items()}
    with torch.no_grad():
        output = model.generate(
            **inputs, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id
        )
    return str(tokenizer.decode(output[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True))


class RewardModel:
    """The suite's reward model, loaded once per job: the score of a prompt and its answer."""

    def __init__(self, spec: RewardModelSpec, field: str, max_bytes: int | None) -> None:
        path, _ = resolve_model(spec, f"{field}.model", max_bytes=max_bytes)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)
        except (OSError, ValueError) as exc:
            raise JobFailed(
                "model_unavailable", "evaluate", f"{field}.model.id: {spec.id} is not loadable as a reward model: {exc}"
            ) from exc
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.model.eval()

    def __call__(self, prompt: str | list[dict[str, Any]], answer: str) -> float:
        if isinstance(prompt, list) and self.tokenizer.chat_template is not None:
            text = str(
                self.tokenizer.apply_chat_template([*prompt, {"role": "assistant", "content": answer}], tokenize=False)
            )
        else:
            text = (prompt if isinstance(prompt, str) else " ".join(str(m.get("content", "")) for m in prompt)) + answer
        inputs = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=2048)
        with torch.no_grad():
            return float(self.model(**inputs).logits[0, 0])


def score(
    model: Any,
    tokenizer: PreTrainedTokenizerBase,
    rows: AnyDataset,
    suite: RewardsSuite,
    field: str,
    reward_model: RewardModel | None = None,
) -> dict[str, float]:
    """`reward_mean`, `reward_pass_rate` and each function's `rewards/<name>/mean` of the model's
    answers to the eval rows' prompts."""
    listed = [dict(row) for row in rows]
    prompts = [_prompt(row, index, field) for index, row in enumerate(listed)]
    was_training = model.training
    model.eval()
    try:
        answers = [_answer(model, tokenizer, prompt, suite.max_new_tokens) for prompt in prompts]
    finally:
        model.train(was_training)
    completions: list[Any] = [
        [{"role": "assistant", "content": a}] if isinstance(p, list) else a
        for p, a in zip(prompts, answers, strict=True)
    ]
    columns = {name: [row.get(name) for row in listed] for name in (listed[0] if listed else {})}
    # The token ids TRL passes its length and repetition rewards, as the trainer counts them.
    completion_ids = [list(tokenizer(a, add_special_tokens=False)["input_ids"]) for a in answers]
    totals = [0.0] * len(completions)
    metrics: dict[str, float] = {}
    for spec in suite.functions:
        missing = columns_needed(spec) - {
            name for name, values in columns.items() if all(v is not None for v in values)
        }
        if missing:
            raise JobFailed(
                "dataset_invalid",
                "evaluate",
                f"{field}: {spec.name} reads column(s) {sorted(missing)}, which the eval rows lack",
            )
        rewards = [
            float(r) if r is not None else 0.0
            for r in REWARD_FUNCTIONS[spec.name](spec)(completions, completion_ids=completion_ids, **columns)
        ]
        metrics[f"rewards/{spec.name}/mean"] = sum(rewards) / len(rewards) if rewards else math.nan
        totals = [t + spec.weight * r for t, r in zip(totals, rewards, strict=True)]
    if suite.model is not None:
        assert reward_model is not None, "the caller loads the suite's reward model"
        scores = [reward_model(p, a) for p, a in zip(prompts, answers, strict=True)]
        metrics["rewards/model/mean"] = sum(scores) / len(scores) if scores else math.nan
        totals = [t + suite.model.weight * r for t, r in zip(totals, scores, strict=True)]
    metrics["reward_mean"] = sum(totals) / len(totals) if totals else math.nan
    metrics["reward_pass_rate"] = sum(t >= suite.pass_threshold for t in totals) / len(totals) if totals else math.nan
    metrics["reward_answers"] = float(len(totals))
    return metrics
