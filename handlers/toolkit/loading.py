"""Loading what a job trains on, in the child: the base model (from the Hub or an allowed local
folder), its tokenizer, the dataset splits; and the preflight checks that fail a job before it
trains (no CUDA for QLoRA, missing columns, conversational rows without a chat template).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, IterableDataset, interleave_datasets
from httpx2 import TransportError
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BitsAndBytesConfig,
    DistributedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from handlers.protocol import JobFailed, JobSpec, is_transient_failure
from handlers.toolkit import fast
from handlers.toolkit.reporting import loading_weights
from handlers.toolkit.sources import AnyDataset, check_download_size, load_source
from schemas.provenance import ResolvedSource
from schemas.request import DatasetSpec, ModelSpec, RequestBase, RewardModelSpec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def is_transient_download_failure(exc: BaseException) -> bool:
    """Whether a download's failure is worth another try: a Hub call's that `handlers.protocol.is_transient_failure`
    says is transient, the rule the daemon's push follows too (daemon/hub/push.py); anything else is not."""
    return isinstance(exc, HfHubHTTPError | TransportError) and is_transient_failure(exc)


def resolve_model(
    spec: ModelSpec | RewardModelSpec, field: str = "model", *, max_bytes: int | None = None
) -> tuple[str, str | None]:
    """The local folder of a model (the base, or the one the request's `field` names) and, for a Hub
    model, the commit it resolved to. A Hub model larger than `max_bytes` (the operator's
    max_model_bytes, its files' sizes as the Hub lists them) fails before anything is downloaded."""
    if spec.id.startswith("/"):
        if not Path(spec.id).is_dir():
            raise JobFailed("model_unavailable", "load_model", f"{field}.id: local path {spec.id} is not a directory")
        return spec.id, None
    try:
        info = HfApi().model_info(spec.id, revision=spec.revision, files_metadata=True)
        check_download_size(f"{field}.id", spec.id, [s.size for s in info.siblings or []], max_bytes, "max_model_bytes")
        sha = info.sha
        return snapshot_download(spec.id, revision=sha), sha
    except (HfHubHTTPError, TransportError) as exc:
        raise JobFailed(
            "model_unavailable",
            "load_model",
            f"{field}.id: cannot download {spec.id}@{spec.revision or 'main'} from the Hub: {exc!r}",
            retryable=is_transient_download_failure(exc),
        ) from exc


def load_tokenizer(path: str, spec: ModelSpec) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model", f"model.id: {spec.id} has no loadable tokenizer: {exc}"
        ) from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if spec.chat_template is not None:  # the request's own template; saved with the artifact, so it is pushed too
        tokenizer.chat_template = spec.chat_template
    return tokenizer


def check_hardware(spec: ModelSpec) -> None:
    """QLoRA loads the base through bitsandbytes, which needs CUDA: fail before anything is loaded."""
    if spec.quantization != "none" and not torch.cuda.is_available():
        raise JobFailed(
            "cuda_required",
            "preflight",
            f"model.quantization: {spec.quantization} (QLoRA) needs a CUDA GPU and this host "
            "has none; use quantization 'none'",
        )


def model_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """`from_pretrained` arguments from the request's model block: dtype, remote code (policy-gated
    at intake), `trl.ModelConfig`'s loading options, and bitsandbytes for QLoRA. The attention is the
    request's, else the host's for this job (handlers/toolkit/fast.py)."""
    kwargs: dict[str, Any] = {"dtype": DTYPES.get(spec.dtype, "auto"), "trust_remote_code": spec.trust_remote_code}
    if (attention := fast.attention(spec)) is not None:
        kwargs["attn_implementation"] = attention
    if spec.quantization == "4bit":
        compute = spec.bnb_4bit_compute_dtype or (spec.dtype if spec.dtype != "auto" else "bfloat16")
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=spec.bnb_4bit_quant_type or "nf4",
            bnb_4bit_use_double_quant=spec.use_bnb_nested_quant,
            bnb_4bit_compute_dtype=DTYPES[compute],
            bnb_4bit_quant_storage=spec.bnb_4bit_quant_storage or "uint8",
        )
    elif spec.quantization == "8bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    return kwargs


def load_causal_lm(
    path: str, spec: ModelSpec, field: str = "model", distributed: DistributedConfig | None = None
) -> PreTrainedModel:
    """`distributed`: how the model is sharded across the job's processes as it loads
    (handlers/toolkit/distributed/fsdp.py)."""
    sharded: dict[str, Any] = {"distributed_config": distributed} if distributed is not None else {}
    try:
        with loading_weights():
            return AutoModelForCausalLM.from_pretrained(path, **model_kwargs(spec), **sharded)
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model", f"{field}.id: {spec.id} is not a loadable causal LM: {exc}"
        ) from exc


def load_sequence_classifier(
    path: str,
    spec: ModelSpec,
    tokenizer: PreTrainedTokenizerBase,
    distributed: DistributedConfig | None = None,
) -> PreTrainedModel:
    """A one-label sequence classifier (a reward model) on the base's weights, with a new score head; `distributed`
    as for `load_causal_lm`."""
    sharded: dict[str, Any] = {"distributed_config": distributed} if distributed is not None else {}
    try:
        with loading_weights():
            model = AutoModelForSequenceClassification.from_pretrained(
                path, num_labels=1, **model_kwargs(spec), **sharded
            )
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model", f"model.id: {spec.id} is not loadable as a sequence classifier: {exc}"
        ) from exc
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def is_conversational(dataset: AnyDataset) -> bool:
    """TRL's own test, on the first row: role/content messages rather than plain text."""
    from trl.data_utils import is_conversational as trl_is_conversational

    first = first_row(dataset)
    return first is not None and trl_is_conversational(first)


def check_chat_template(tokenizer: PreTrainedTokenizerBase, dataset: AnyDataset, spec: ModelSpec) -> None:
    if is_conversational(dataset) and tokenizer.chat_template is None:
        raise JobFailed(
            "dataset_invalid",
            "preflight",
            f"model.id: {spec.id} has no chat template, and the dataset's rows are conversational",
        )


def check_columns(request: RequestBase, dataset: AnyDataset) -> None:
    problem = request.dataset_problem(column_names(dataset))
    if problem:
        raise JobFailed("dataset_invalid", "preflight", problem)


def _carved(rows: AnyDataset, size: float | int, seed: int) -> tuple[AnyDataset, AnyDataset]:
    """`size` of the rows (a fraction, or a count) as the eval set and the rest to train on, chosen
    by `seed`: the same split on every attempt (TRL's own split is unseeded). The schema keeps a
    stream from getting here."""
    assert not isinstance(rows, IterableDataset)
    try:
        parts = rows.train_test_split(test_size=size, seed=seed)
    except ValueError as exc:  # too few rows for the size to leave a row on each side
        raise JobFailed(
            "dataset_invalid", "load_dataset", f"dataset.test_split_size: {size} of {len(rows)} rows: {exc}"
        ) from exc
    return parts["train"], parts["test"]


def load_dataset_sources(
    spec: DatasetSpec, job: JobSpec, seed: int = 42
) -> tuple[AnyDataset, AnyDataset | None, list[ResolvedSource]]:
    """The training rows (one source, or a mixture interleaved by proportion) and the eval rows (a
    split of the same source, or a source of its own), columns renamed, at most `max_samples` rows,
    within the operator's `max_dataset_rows`; and what each source resolved to."""
    sources: list[ResolvedSource] = []
    try:
        if spec.mixture is not None:
            total = sum(part.proportion for part in spec.mixture)
            parts = []
            for index, part in enumerate(spec.mixture):
                rows, resolved = load_source(
                    part, part.split, "train", job, streaming=spec.streaming, field=f"dataset.mixture.{index}"
                )
                parts.append(_renamed(rows, part.columns, f"dataset.mixture.{index}"))
                sources.append(resolved.model_copy(update={"proportion": part.proportion / total}))
            train = _interleave(parts, [part.proportion / total for part in spec.mixture], seed)
        else:
            rows, resolved = load_source(spec, spec.split, "train", job, streaming=spec.streaming, field="dataset")
            train = _renamed(rows, spec.columns, "dataset")
            sources.append(resolved)
        evaluation = None
        if spec.eval is not None:
            rows, resolved = load_source(spec.eval, spec.eval.split, "eval", job, streaming=False, field="dataset.eval")
            evaluation = _renamed(rows, spec.eval.columns, "dataset.eval")
            sources.append(resolved)
        elif spec.eval_split is not None:
            rows, resolved = load_source(spec, spec.eval_split, "eval", job, streaming=False, field="dataset")
            evaluation = _renamed(rows, spec.columns, "dataset")
            sources.append(resolved)
    except JobFailed:
        raise
    except Exception as exc:  # datasets and fsspec raise many unrelated types for "cannot load"
        source = (
            "inline rows" if spec.rows is not None else f"{spec.id or spec.url or 'its sources'} (split {spec.split})"
        )
        raise JobFailed(
            "dataset_unavailable",
            "load_dataset",
            f"dataset: cannot load {source}: {type(exc).__name__}: {exc}",
            retryable=is_transient_download_failure(exc),
        ) from exc
    if spec.test_split_size is not None:
        train, evaluation = _carved(train, spec.test_split_size, seed)
    if spec.max_samples is not None:
        train = _at_most(train, spec.max_samples)
    if isinstance(train, IterableDataset):
        # A stream's length is unknown until it ends: the operator's limit caps what is read.
        return (train.take(job.max_dataset_rows) if job.max_dataset_rows is not None else train), evaluation, sources
    if job.max_dataset_rows is not None and len(train) > job.max_dataset_rows:
        raise JobFailed(
            "dataset_too_large",
            "load_dataset",
            f"dataset: {len(train)} training rows; this host allows at most {job.max_dataset_rows} "
            "(max_dataset_rows); set dataset.max_samples",
        )
    return train, evaluation, sources


def _renamed(rows: AnyDataset, columns: dict[str, str], field: str) -> AnyDataset:
    if not columns:
        return rows
    present = column_names(rows)
    missing = sorted(set(columns) - set(present))
    if missing:
        raise JobFailed(
            "dataset_invalid", "preflight", f"{field}.columns: {missing} not in the dataset's columns {present}"
        )
    return rows.rename_columns(columns)


def _at_most(rows: AnyDataset, count: int) -> AnyDataset:
    if isinstance(rows, IterableDataset):
        return rows.take(count)
    return rows.select(range(count)) if len(rows) > count else rows


def _interleave(parts: list[AnyDataset], shares: list[float], seed: int) -> AnyDataset:
    """Rows drawn from each part by its share, until every part is used up; the parts keep only the
    columns they all have, in the first part's types, so their rows line up."""
    common = [name for name in column_names(parts[0]) if all(name in column_names(part) for part in parts[1:])]
    parts = [part.select_columns(common) for part in parts]
    if all(isinstance(part, Dataset) for part in parts):
        features = parts[0].features
        parts = [parts[0], *(part.cast(features) if part.features != features else part for part in parts[1:])]
    return interleave_datasets(parts, probabilities=shares, seed=seed, stopping_strategy="all_exhausted")


def column_names(rows: AnyDataset) -> list[str]:
    """A dataset's columns; a stream whose format does not say is read for its first row."""
    if rows.column_names is not None:
        return list(rows.column_names)
    first = first_row(rows)
    return list(first) if first is not None else []


def first_row(rows: AnyDataset) -> dict[str, Any] | None:
    if isinstance(rows, IterableDataset):
        return next(iter(rows.take(1)), None)
    return rows[0] if len(rows) > 0 else None


def fingerprint(rows: AnyDataset, sources: list[ResolvedSource]) -> str | None:
    """datasets' own fingerprint of the rows; for a stream, which has none, a hash of what it was resolved to."""
    if isinstance(rows, Dataset):
        return rows._fingerprint
    text = json.dumps([source.model_dump(mode="json") for source in sources], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
