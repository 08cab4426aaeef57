"""The model card (README.md) pushed with an artifact: Hub metadata up top, then what produced it —
the base model, the resolved dataset sources (provenance), metrics and versions; for a
vision-language model, its `pipeline_tag` (image-text-to-text) and how to load it with its processor.

The Hub refuses a card whose `base_model` is not a Hub id, and a host path there would leak the
host's layout: a local base names the Hub id it came from (the operator's `local_model_hub_ids`, or
its config's `_name_or_path` when that is a Hub id), or `base_model` is left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub import EvalResult, ModelCardData

from handlers.protocol import StartPoint
from schemas.common import HUB_ID_PATTERN
from schemas.evaluation import EvaluationReport
from schemas.provenance import ResolvedSource, TrackedRun
from schemas.request import RequestBase

HUB_ID = re.compile(HUB_ID_PATTERN)


def card_base_model(model_id: str, local_model_hub_ids: dict[str, str] | None = None) -> str | None:
    """The Hub id to name as `base_model`, or None when a local base cannot say where it came from."""
    if not model_id.startswith("/"):
        return model_id
    mapped = (local_model_hub_ids or {}).get(model_id) or (local_model_hub_ids or {}).get(model_id.rstrip("/"))
    if mapped:
        return mapped
    try:
        name = json.loads((Path(model_id) / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return name if isinstance(name, str) and HUB_ID.fullmatch(name) and not Path(name).exists() else None


def _source_lines(sources: Sequence[ResolvedSource]) -> str:
    lines = []
    for source in sources:
        where = f"`{source.location}`" + (f" at `{source.revision}`" if source.revision else "")
        share = f", {source.proportion:.0%} of the mixture" if source.proportion is not None else ""
        files = "; ".join(
            f"`{f.path}`"
            + (f" ({f.size} bytes)" if f.size is not None else "")
            + (f" ETag {f.etag}" if f.etag else "")
            + (f" version {f.version_id}" if f.version_id else "")
            for f in source.files[:20]
        )
        more = f" and {len(source.files) - 20} more" if len(source.files) > 20 else ""
        lines.append(f"- {source.role}: {source.kind} {where}{share}" + (f": {files}{more}" if files else ""))
    return "\n".join(lines)


@dataclass(frozen=True)
class CardContents:
    """What a model card says of one artifact: the request that made it and what its training reported
    (the child's TrainResult: daemon/job/report.py fills it), and the gate's evaluation if it ran."""

    request: RequestBase
    trainer: str  # the TRL trainer and config that trained it, e.g. "trl.SFTTrainer/trl.SFTConfig"
    base_model_revision: str | None = None  # the base model's resolved commit, when it came from the Hub
    metrics: Mapping[str, float] = field(default_factory=dict)
    versions: Mapping[str, str] = field(default_factory=dict)  # the libraries it trained with
    dataset_sources: Sequence[ResolvedSource] = ()
    dataset_fingerprint: str | None = None
    pipeline_tag: str | None = None  # the Hub task of a model that is not a plain text generator
    tracking: Sequence[TrackedRun] = ()
    evaluation: EvaluationReport | None = None
    start: StartPoint | None = None  # what its `start_from` published (daemon/jobs/prerequisites.py)


def model_card(contents: CardContents, local_model_hub_ids: dict[str, str] | None = None) -> str:
    """The card's text; a local base is named by the Hub id the operator's `local_model_hub_ids` give it."""
    request, pipeline_tag, evaluation = contents.request, contents.pipeline_tag, contents.evaluation
    is_adapter = request.peft is not None and request.output.push == "adapter"
    base = card_base_model(request.model.id, local_model_hub_ids)
    vision = pipeline_tag == "image-text-to-text"
    card = ModelCardData(
        base_model=base,
        library_name="peft" if is_adapter else "transformers",
        pipeline_tag=pipeline_tag,
        tags=[
            "trl",
            request.method,
            "adapterd",
            "lora" if request.peft is not None else "full-fine-tune",
            *(["vision-language"] if vision else []),
        ],
        # The Hub's model-index: the adapter's numbers and each baseline's, on the same eval rows.
        model_name=request.output.repo_id if evaluation is not None else None,
        eval_results=_eval_results(request, evaluation, pipeline_tag) if evaluation is not None else None,
    )
    metric_lines = "\n".join(f"| {name} | {value:.6g} |" for name, value in sorted(contents.metrics.items()))
    version_line = ", ".join(f"{name} {value}" for name, value in sorted(contents.versions.items()))
    # A local base is named by its Hub id when known, else only as a local model: its path stays on the host.
    base_text = f"`{base}`" if base else "a local model"
    dataset = request.dataset.id or ("inline rows" if request.dataset.rows is not None else "see below")
    return (
        f"---\n{card.to_yaml()}\n---\n\n"
        f"# {request.output.repo_id}\n\n"
        f"{'A LoRA adapter' if is_adapter else 'A model'} trained by adapterd with TRL's `{contents.trainer}` "
        f"(method `{request.method}`) on the base model {base_text}"
        f"{f' at revision `{contents.base_model_revision}`' if contents.base_model_revision else ''}.\n\n"
        f"- Request id: `{request.request_id}`\n"
        f"- Dataset: `{dataset}`\n"
        + (f"- Dataset fingerprint: `{contents.dataset_fingerprint}`\n" if contents.dataset_fingerprint else "")
        + _chain_lines(request, contents.start)
        + f"- Versions: {version_line}\n"
        + "".join(
            f"- Metrics tracked in {run.tracker}: run "
            f"`{run.run_id}`{f' of project `{run.project}`' if run.project else ''}"
            f"{f' ({run.url})' if run.url else ''}\n"
            for run in contents.tracking
        )
        + "\n"
        + (f"## Training data\n\n{_source_lines(contents.dataset_sources)}\n\n" if contents.dataset_sources else "")
        + (_vision_usage(base, request.output.repo_id, is_adapter) if vision else "")
        + (_evaluation_section(evaluation) if evaluation is not None else "")
        + f"| metric | value |\n|---|---|\n{metric_lines}\n"
    )


def _chain_lines(request: RequestBase, start: StartPoint | None) -> str:
    """The pipeline it is a step of (`after`, `start_from`): the requests it followed and the artifact it trained on."""
    if not request.after:
        return ""
    lines = f"- After: {', '.join(f'`{each}`' for each in request.after)}\n"
    if start is not None:
        at = f"`{start.repo_id}` at `{start.commit_sha}`" if start.commit_sha else f"`{start.repo_id}` (local sink)"
        lines += f"- Started from: {at}, published by `{start.request_id}`\n"
    return lines


def _eval_dataset(request: RequestBase) -> str:
    source = request.dataset.eval
    if source is not None:
        return source.id or ("inline rows" if source.rows is not None else "held-out rows")
    return f"{request.dataset.id or 'dataset'} ({request.dataset.eval_split})"


def _eval_results(request: RequestBase, report: EvaluationReport, pipeline_tag: str | None) -> list[EvalResult]:
    """Every finite number of the adapter and of each baseline, as the Hub's model-index entries
    (a baseline's named after it, e.g. 'eval_loss (base)')."""
    task = pipeline_tag or ("text-classification" if request.method == "reward" else "text-generation")
    dataset = _eval_dataset(request)
    results = []
    for who, metrics in [("adapter", report.adapter), *report.baselines.items()]:
        for name, value in sorted(metrics.items()):
            if value is not None:
                results.append(
                    EvalResult(
                        task_type=task,
                        dataset_type=dataset,
                        dataset_name=dataset,
                        metric_type=name,
                        metric_value=value,
                        metric_name=name if who == "adapter" else f"{name} ({who})",
                    )
                )
    return results


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.6g}"


def _evaluation_section(report: EvaluationReport) -> str:
    """The evaluation as a reader wants it: each metric of the adapter beside the baselines', then
    each gate rule's outcome and the verdict."""
    who = list(report.baselines)
    names = sorted(set(report.adapter).union(*report.baselines.values()))
    header = "| metric | adapter |" + "".join(f" {name} |" for name in who) + "\n|---|---|" + "---|" * len(who) + "\n"
    rows = "".join(
        f"| {name} | {_number(report.adapter.get(name))} |"
        + "".join(f" {_number(report.baselines[w].get(name))} |" for w in who)
        + "\n"
        for name in names
    )
    revisions = "".join(
        f"- The {name} baseline is the adapter at commit `{rev}`.\n"
        for name, rev in report.baseline_revisions.items()
        if rev
    )
    missing = "".join(f"- No {name} baseline: {why}.\n" for name, why in report.missing_baselines.items())
    best = (
        f"- The published weights are the best evaluated checkpoint, step {report.best_checkpoint_step}.\n"
        if report.best_checkpoint_step
        else ""
    )
    rules = "".join(
        f"| {r.rule} | {_number(r.value)} | {_number(r.bound)} | {r.outcome}{f': {r.reason}' if r.reason else ''} |\n"
        for r in report.rules
    )
    return (
        f"## Evaluation\n\nOn {report.rows} held-out rows; gate verdict: "
        f"**{report.verdict}**.\n\n{revisions}{missing}{best}\n"
        f"{header}{rows}\n| gate rule | value | bound | outcome |\n|---|---|---|---|\n{rules}\n"
    )


def _vision_usage(base: str | None, repo_id: str, is_adapter: bool) -> str:
    """How to load a vision-language result: the processor (image processor, tokenizer, chat template)
    is in this repo; an adapter goes on its base model with PEFT."""
    if is_adapter:
        load = (
            f"model = AutoModelForImageTextToText.from_pretrained({base or 'BASE_MODEL'!r})\n"
            f"model = PeftModel.from_pretrained(model, {repo_id!r})\n"
        )
        imports = "from peft import PeftModel\nfrom transformers import AutoModelForImageTextToText, AutoProcessor\n"
    else:
        load = f"model = AutoModelForImageTextToText.from_pretrained({repo_id!r})\n"
        imports = "from transformers import AutoModelForImageTextToText, AutoProcessor\n"
    return (
        "## How to use\n\n```python\n"
        + imports
        + f"processor = AutoProcessor.from_pretrained({repo_id!r})\n"
        + load
        + 'messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": '
        '"What is in this picture?"}]}]\n'
        + "prompt = processor.apply_chat_template(messages, add_generation_prompt=True)\n"
        + 'inputs = processor(images=[image], text=prompt, return_tensors="pt")\n'
        + "print(processor.decode(model.generate(**inputs, max_new_tokens=32)[0]))\n```\n\n"
    )
