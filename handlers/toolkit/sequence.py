"""The sequence every handler follows, said once: load and check the data (a vision-language job's
images too), load the base model's tokenizer (and processor), train (resuming from an earlier
attempt's checkpoint), save the artifact, report.

A handler calls these in order and builds its own TRL trainer in between, so each method's module
reads top to bottom: what differs between methods is only what it builds there. The helpers the
steps stand on are in handlers/toolkit/loading.py, handlers/toolkit/training.py and
handlers/toolkit/reporting.py; a handler imports what it uses of them from there, as it imports
the steps from here (this module re-exports nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

import datasets
from huggingface_hub import constants
from peft import LoraConfig
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    ProcessorMixin,
    Trainer,
)

from handlers.protocol import JobFailed, JobSpec, TrainResult
from handlers.toolkit import fast
from handlers.toolkit.chat_template import check_template_render
from handlers.toolkit.distributed import checkpoints as sharded_checkpoints
from handlers.toolkit.distributed.fsdp import distributed_config, is_sharded
from handlers.toolkit.distributed.ranks import largest
from handlers.toolkit.evaluation import evaluate
from handlers.toolkit.loading import (
    check_chat_template,
    check_columns,
    check_hardware,
    column_names,
    fingerprint,
    load_causal_lm,
    load_dataset_sources,
    load_tokenizer,
    model_kwargs,
    resolve_model,
)
from handlers.toolkit.reporting import StatusReporter, start_cuda
from handlers.toolkit.sources import AnyDataset
from handlers.toolkit.start_from import start_base
from handlers.toolkit.training import (
    final_metrics,
    last_checkpoint,
    lora_config,
    package_versions,
    save_artifact,
    tracked_runs,
)
from handlers.toolkit.vision import (
    PIPELINE_TAG,
    is_vision_model,
    language_model_targets,
    load_processor,
    load_vision_model,
    prepare_images,
)
from schemas.evaluation import EvaluationResult
from schemas.images import image_column
from schemas.methods import METHODS
from schemas.provenance import ResolvedSource, TrackedRun
from schemas.request import LoraSpec, ModelSpec, ReferencedRequest, ReferenceModelSpec, RequestBase

if TYPE_CHECKING:
    import torch


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
    processor: ProcessorMixin | None = None  # a vision-language model's (its tokenizer is `tokenizer`)

    @property
    def vision(self) -> bool:
        return self.processor is not None

    @property
    def processing_class(self) -> PreTrainedTokenizerBase | ProcessorMixin:
        """What the trainer is given: the processor of a vision-language model, else the tokenizer."""
        return self.processor if self.processor is not None else self.tokenizer


def load_data(request: RequestBase, job: JobSpec, reporter: StatusReporter) -> Data:
    """Stage `load_dataset`: fail early without the hardware the request needs, then load the splits
    and check the training split has the columns the method reads."""
    check_hardware(request.model)
    if request.model.chat_template is not None:
        check_template_render(request.model.chat_template, max_bytes=job.max_template_bytes, max_s=job.max_template_s)
    reporter.enter("load_dataset")
    train, evaluation, sources = load_dataset_sources(request.dataset, job, seed=request.training.seed or 42)
    check_columns(request, train)
    # A Hub dataset's images may be files datasets itself downloaded into its cache.
    trusted = (
        [Path(datasets.config.HF_DATASETS_CACHE), Path(constants.HF_HUB_CACHE)]
        if any(s.kind == "hub" for s in sources)
        else []
    )
    train = prepare_images(train, job, trusted)
    evaluation = prepare_images(evaluation, job, trusted) if evaluation is not None else None
    return Data(train, evaluation, sources)


def load_base(request: RequestBase, job: JobSpec, reporter: StatusReporter, data: Data) -> Base:
    """Stage `load_model`: download (or find) the base model and load its tokenizer, which must have a
    chat template when the rows are conversational; for rows with images, the base must be a
    vision-language model and its processor is loaded too. The handler loads the model itself, as its method needs."""
    reporter.enter("load_model")
    # A job started from a published whole model has it for its base (handlers/toolkit/start_from.py).
    path, revision = start_base(request, job) or resolve_model(request.model, max_bytes=job.max_model_bytes)
    start_cuda(reporter.memory, job.memory_fraction)
    fast.choose_attention(request.model, job)
    images = image_column(column_names(data.train))
    if images is not None:
        if not is_vision_model(path, request.model):
            raise JobFailed(
                "dataset_invalid",
                "preflight",
                f"model.id: {request.model.id} is not a vision-language model (its config has no vision_config), "
                f"and the dataset's rows have images ('{images}')",
            )
        processor = load_processor(path, request.model)
        return Base(path, revision, processor.tokenizer, processor)
    tokenizer = load_tokenizer(path, request.model)
    check_chat_template(tokenizer, data.train, request.model)
    return Base(path, revision, tokenizer)


def load_policy(
    base: Base, spec: ModelSpec, field: str = "model", request: RequestBase | None = None
) -> PreTrainedModel:
    """The model to train from the base's folder: a vision-language model as transformers loads one
    (`AutoModelForImageTextToText`), else a causal LM; given the `request`, sharded across the job's
    processes as its `resources.shard` asks (handlers/toolkit/distributed/fsdp.py)."""
    distributed = distributed_config(request) if request is not None else None
    if base.vision:
        if distributed is not None:
            raise JobFailed(
                "config_invalid",
                "preflight",
                f"resources.shard: a vision-language model ({spec.id}) does not shard yet; use shard 'none'",
            )
        return load_vision_model(base.path, spec, field, model_kwargs(spec))
    return load_causal_lm(base.path, spec, field, distributed)


def policy_lora(spec: LoraSpec | None, base: Base, model: PreTrainedModel) -> LoraConfig | None:
    """LoRA for a causal LM; for a vision-language model, aimed at its language model (the vision tower
    stays frozen) unless the request names its own `target_modules`, which may widen it."""
    if base.vision and spec is not None and "target_modules" not in spec.model_fields_set:
        return lora_config(spec, "CAUSAL_LM", model, target_modules=language_model_targets(model))
    return lora_config(spec, "CAUSAL_LM", model)


@dataclass(frozen=True)
class Reference:
    # a frozen model beside the policy: the reference it is compared with, or the teacher it learns from
    model: PreTrainedModel
    revision: str | None  # the Hub commit it resolved to; None for a local folder


def load_reference(request: RequestBase, job: JobSpec, base: Base) -> Reference | None:
    """Stage `load_model`, for DPO and KTO: the request's `ref_model` (`load_beside_base`), or None
    when the base is the reference (TRL's default)."""
    spec = request.ref_model if isinstance(request, ReferencedRequest) else None
    return None if spec is None else load_beside_base(request, job, base, spec, "ref_model", "the reference model")


def load_beside_base(
    request: RequestBase, job: JobSpec, base: Base, spec: ReferenceModelSpec, field: str, role: str
) -> Reference:
    """Stage `load_model`: the frozen model the request names in `field` (DPO's and KTO's reference,
    distillation's teacher), loaded like the base (its dtype, quantization and trust_remote_code). The
    trainer feeds it the base tokenizer's ids, so it must have an embedding for each of them."""
    as_base = request.model.model_copy(update={"id": spec.id, "revision": spec.revision})
    path, revision = resolve_model(as_base, field, max_bytes=job.max_model_bytes)
    model = load_policy(Base(path, revision, base.tokenizer, base.processor), as_base, field)
    embeddings, tokens = cast("torch.nn.Embedding", model.get_input_embeddings()).num_embeddings, len(base.tokenizer)
    if embeddings < tokens:
        raise JobFailed(
            "model_unavailable",
            "load_model",
            f"{field}.id: {spec.id} has {embeddings} token embeddings and the base model's tokenizer {tokens} tokens: "
            f"{role} must share the base model's tokenizer",
        )
    return Reference(model, revision)


def train_and_save(
    trainer: Trainer,
    request: RequestBase,
    job: JobSpec,
    reporter: StatusReporter,
    data: Data,
    base: Base,
    reference: Reference | None = None,
    *,
    teacher: Reference | None = None,
) -> TrainResult:
    """Stages `train`, `save` and `evaluate`: train from the last checkpoint of an earlier attempt
    (step 0 when there is none), write the artifact, measure it as the request's evaluation asks
    (handlers/toolkit/evaluation/__init__.py; after the save, so the artifact is the trained model untouched), and
    report."""
    reporter.enter("train")
    checkpoint = last_checkpoint(job)
    if is_sharded(
        trainer.model
    ):  # its checkpoints completed with the state the Trainer leaves out, and resumed with it
        checkpoint = sharded_checkpoints.attach(trainer, checkpoint)
    output = trainer.train(resume_from_checkpoint=checkpoint)
    reporter.enter("save")
    # Before the save, of the model as trained (a merge, output.push merged, unloads the adapter from a whole copy),
    # and before the evaluation logs its baselines' numbers.
    metrics = final_metrics(trainer, output.metrics)
    save_artifact(trainer, request, job.artifact)
    evaluation = evaluate(trainer, request, job, reporter, data.eval)
    return result(
        request,
        reporter,
        data,
        base,
        metrics,
        reference,
        tracking=tracked_runs(job, trainer),
        evaluation=evaluation,
        teacher=teacher,
    )


def result(
    request: RequestBase,
    reporter: StatusReporter,
    data: Data,
    base: Base,
    metrics: dict[str, float],
    reference: Reference | None = None,
    *,
    tracking: list[TrackedRun] | None = None,
    evaluation: EvaluationResult | None = None,
    teacher: Reference | None = None,
) -> TrainResult:
    """Stage `done`: what the child hands the daemon for the `succeeded` event; the trainer it names
    comes from the method table. In a job of several processes its memory is the rank's that took the most, and
    the metrics say each rank's peak (`rank<r>_peak_bytes`): every rank gathers them here."""
    reporter.enter("done")
    memory, rank_peaks = largest(reporter.memory.use())
    return TrainResult(
        trainer=METHODS[request.method].trained_by,
        metrics={**metrics, **rank_peaks},
        base_model_revision=base.revision,
        ref_model_revision=reference.revision if reference is not None else None,
        teacher_model_revision=teacher.revision if teacher is not None else None,
        dataset_fingerprint=fingerprint(data.train, data.sources),
        dataset_sources=data.sources,
        durations_s=reporter.durations_s,
        versions=package_versions(),
        pipeline_tag=PIPELINE_TAG if base.vision else None,
        tracking=tracking or [],
        evaluation=evaluation,
        memory=memory,
        fast=dict(reporter.fast),
    )
