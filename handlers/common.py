"""The sequence every handler follows, said once: load and check the data, load the base model's
tokenizer, train (resuming from an earlier attempt's checkpoint), save the artifact, report.

A handler calls these in order and builds its own TRL trainer in between, so each method's module
reads top to bottom: what differs between methods is only what it builds there. The helpers they
stand on are in handlers/loading.py, handlers/training.py and handlers/reporting.py; the names a
handler needs are re-exported here.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedModel, PreTrainedTokenizerBase, Trainer

from handlers.loading import (
    check_chat_template,
    check_columns,
    check_hardware,
    fingerprint,
    load_causal_lm,
    load_dataset_sources,
    load_sequence_classifier,
    load_tokenizer,
    resolve_model,
)
from handlers.reporting import EXIT_STOPPED, JobCallback, StatusReporter
from handlers.sources import AnyDataset
from handlers.training import (
    final_metrics,
    last_checkpoint,
    lora_config,
    package_versions,
    save_artifact,
    trl_config,
)
from schemas.job import JobFailed, JobSpec, TrainResult
from schemas.methods import METHODS
from schemas.provenance import ResolvedSource
from schemas.request import RequestBase

__all__ = [
    "EXIT_STOPPED", "Base", "Data", "JobCallback", "Reference", "StatusReporter", "load_base", "load_causal_lm", "load_data",
    "load_reference", "load_sequence_classifier", "lora_config", "resolve_model", "result", "train_and_save", "trl_config",
]


@dataclass(frozen=True)
class Data:
    train: AnyDataset  # an IterableDataset when the request streams
    eval: AnyDataset | None
    sources: list[ResolvedSource]  # what the rows were resolved to (provenance)


@dataclass(frozen=True)
class Base:
    path: str  # the local folder of the base model
    revision: str | None  # the Hub commit it resolved to; None for a local folder
    tokenizer: PreTrainedTokenizerBase


def load_data(request: RequestBase, job: JobSpec, reporter: StatusReporter) -> Data:
    """Stage `load_dataset`: fail early without the hardware the request needs, then load the splits
    and check the training split has the columns the method reads."""
    check_hardware(request.model)
    reporter.enter("load_dataset")
    train, evaluation, sources = load_dataset_sources(request.dataset, job, seed=request.training.seed or 42)
    check_columns(request, train)
    return Data(train, evaluation, sources)


def load_base(request: RequestBase, reporter: StatusReporter, data: Data) -> Base:
    """Stage `load_model`: download (or find) the base model and load its tokenizer, which must have a
    chat template when the rows are conversational. The handler loads the model itself, as its method needs."""
    reporter.enter("load_model")
    path, revision = resolve_model(request.model)
    tokenizer = load_tokenizer(path, request.model)
    check_chat_template(tokenizer, data.train, request.model)
    return Base(path, revision, tokenizer)


@dataclass(frozen=True)
class Reference:
    model: PreTrainedModel  # the frozen reference the trainer compares the policy with
    revision: str | None  # the Hub commit it resolved to; None for a local folder


def load_reference(request: RequestBase, base: Base) -> Reference | None:
    """Stage `load_model`, for DPO and KTO: the request's `ref_model`, loaded like the base (its dtype,
    quantization and trust_remote_code), or None when the base is the reference (TRL's default). The
    trainer feeds it the base tokenizer's ids, so it must have an embedding for each of them."""
    spec = getattr(request, "ref_model", None)
    if spec is None:
        return None
    as_base = request.model.model_copy(update={"id": spec.id, "revision": spec.revision})
    path, revision = resolve_model(as_base, "ref_model")
    model = load_causal_lm(path, as_base, "ref_model")
    embeddings, tokens = model.get_input_embeddings().num_embeddings, len(base.tokenizer)
    if embeddings < tokens:
        raise JobFailed(
            "model_unavailable", "load_model",
            f"ref_model.id: {spec.id} has {embeddings} token embeddings and the base model's tokenizer {tokens} tokens: "
            "the reference model must share the base model's tokenizer",
        )
    return Reference(model, revision)


def train_and_save(
    trainer: Trainer, request: RequestBase, job: JobSpec, reporter: StatusReporter, data: Data, base: Base,
    reference: Reference | None = None,
) -> TrainResult:
    """Stages `train` and `save`: train from the last checkpoint of an earlier attempt (step 0 when
    there is none), write the artifact, and report."""
    reporter.enter("train")
    output = trainer.train(resume_from_checkpoint=last_checkpoint(job))
    reporter.enter("save")
    save_artifact(trainer, request, job.artifact)
    return result(request, reporter, data, base, final_metrics(trainer, output.metrics), reference)


def result(
    request: RequestBase, reporter: StatusReporter, data: Data, base: Base, metrics: dict[str, float], reference: Reference | None = None,
) -> TrainResult:
    """Stage `done`: what the child hands the daemon for the `succeeded` event; the trainer it names
    comes from the method table."""
    reporter.enter("done")
    return TrainResult(
        trainer=METHODS[request.method].trained_by,  # type: ignore[attr-defined]
        metrics=metrics,
        base_model_revision=base.revision,
        ref_model_revision=reference.revision if reference is not None else None,
        dataset_fingerprint=fingerprint(data.train, data.sources),
        dataset_sources=data.sources,
        durations_s=reporter.durations_s,
        versions=package_versions(),
    )
