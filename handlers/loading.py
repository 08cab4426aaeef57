"""Loading what a job trains on, in the child: the base model (from the Hub or an allowed local
folder), its tokenizer, the dataset splits; and the preflight checks that fail a job before it
trains (no CUDA for QLoRA, missing columns, conversational rows without a chat template).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from datasets import Dataset, load_dataset
from httpx2 import TransportError
from huggingface_hub import HfApi, snapshot_download
from huggingface_hub.errors import HfHubHTTPError
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BitsAndBytesConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from schemas.job import JobFailed, JobSpec, is_transient
from schemas.request import DatasetSpec, ModelSpec, RequestBase, RewardModelSpec

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed Hub call; None when no answer came (a network error, a timeout)."""
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def resolve_model(spec: ModelSpec | RewardModelSpec) -> tuple[str, str | None]:
    """The local folder of the base model and, for a Hub model, the commit it resolved to."""
    if spec.id.startswith("/"):
        if not Path(spec.id).is_dir():
            raise JobFailed("model_unavailable", "load_model", f"model.id: local path {spec.id} is not a directory")
        return spec.id, None
    try:
        sha = HfApi().model_info(spec.id, revision=spec.revision).sha
        return snapshot_download(spec.id, revision=sha), sha
    except (HfHubHTTPError, TransportError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model",
            f"model.id: cannot download {spec.id}@{spec.revision or 'main'} from the Hub: {exc!r}",
            retryable=is_transient(_http_status(exc)),
        ) from exc


def load_tokenizer(path: str, spec: ModelSpec) -> PreTrainedTokenizerBase:
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise JobFailed("model_unavailable", "load_model", f"model.id: {spec.id} has no loadable tokenizer: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def check_hardware(spec: ModelSpec) -> None:
    """QLoRA loads the base through bitsandbytes, which needs CUDA: fail before anything is loaded."""
    if spec.quantization != "none" and not torch.cuda.is_available():
        raise JobFailed(
            "cuda_required", "preflight",
            f"model.quantization: {spec.quantization} (QLoRA) needs a CUDA GPU and this host has none; use quantization 'none'",
        )


def model_kwargs(spec: ModelSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"dtype": DTYPES.get(spec.dtype, "auto"), "trust_remote_code": spec.trust_remote_code}
    if spec.quantization == "4bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16
        )
    elif spec.quantization == "8bit":
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_8bit=True)
    return kwargs


def load_causal_lm(path: str, spec: ModelSpec) -> PreTrainedModel:
    try:
        return AutoModelForCausalLM.from_pretrained(path, **model_kwargs(spec))
    except (OSError, ValueError) as exc:
        raise JobFailed("model_unavailable", "load_model", f"model.id: {spec.id} is not a loadable causal LM: {exc}") from exc


def load_sequence_classifier(path: str, spec: ModelSpec, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A one-label sequence classifier (a reward model) on the base's weights, with a new score head."""
    try:
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **model_kwargs(spec))
    except (OSError, ValueError) as exc:
        raise JobFailed("model_unavailable", "load_model", f"model.id: {spec.id} is not loadable as a sequence classifier: {exc}") from exc
    model.config.pad_token_id = tokenizer.pad_token_id
    return model


def is_conversational(dataset: Dataset) -> bool:
    """TRL's own test: rows of role/content messages rather than plain text."""
    from trl.data_utils import is_conversational as trl_is_conversational

    return len(dataset) > 0 and trl_is_conversational(dataset[0])


def check_chat_template(tokenizer: PreTrainedTokenizerBase, dataset: Dataset, spec: ModelSpec) -> None:
    if is_conversational(dataset) and tokenizer.chat_template is None:
        raise JobFailed("dataset_invalid", "preflight", f"model.id: {spec.id} has no chat template, and the dataset's rows are conversational")


def check_columns(request: RequestBase, dataset: Dataset) -> None:
    problem = request.dataset_problem(dataset.column_names)
    if problem:
        raise JobFailed("dataset_invalid", "preflight", problem)


def load_datasets(spec: DatasetSpec, job: JobSpec) -> tuple[Dataset, Dataset | None]:
    """The training split (and the eval split, if asked), columns renamed, at most `max_samples` rows,
    within the operator's `max_dataset_rows`."""
    try:
        if spec.rows is not None:
            train, evaluation = Dataset.from_list(list(spec.rows)), None
        else:
            def split(name: str) -> Dataset:
                return load_dataset(spec.id, spec.config, split=name, revision=spec.revision, data_files=spec.data_files)

            train = split(spec.split)
            evaluation = split(spec.eval_split) if spec.eval_split else None
    except Exception as exc:  # datasets raises many unrelated types for "cannot load"
        source = "inline rows" if spec.rows is not None else f"{spec.id} (split {spec.split})"
        raise JobFailed(
            "dataset_unavailable", "load_dataset", f"dataset: cannot load {source}: {type(exc).__name__}: {exc}",
            retryable=isinstance(exc, HfHubHTTPError | TransportError) and is_transient(_http_status(exc)),
        ) from exc
    if spec.columns:
        missing = sorted(set(spec.columns) - set(train.column_names))
        if missing:
            raise JobFailed("dataset_invalid", "preflight", f"dataset.columns: {missing} not in the dataset's columns {train.column_names}")
        train = train.rename_columns(spec.columns)
        evaluation = evaluation.rename_columns(spec.columns) if evaluation is not None else None
    if spec.max_samples is not None and len(train) > spec.max_samples:
        train = train.select(range(spec.max_samples))
    if job.max_dataset_rows is not None and len(train) > job.max_dataset_rows:
        raise JobFailed(
            "dataset_too_large", "load_dataset",
            f"dataset: {len(train)} training rows; this host allows at most {job.max_dataset_rows} (max_dataset_rows); set dataset.max_samples",
        )
    return train, evaluation

