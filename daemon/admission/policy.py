"""The operator's rules for what a request may ask of this host. A request outside them is rejected,
each broken rule named by the request field it concerns and the setting that refused it."""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Any

import fsspec

from daemon.admission.bounds import bound_errors
from daemon.admission.capabilities import library_version
from daemon.admission.hub_ids import hub_id_errors
from daemon.settings import Settings
from schemas import FieldError
from schemas.dataset import SourceSpec
from schemas.evaluation import RewardsSuite, TaskSuite
from schemas.locations import local_location_inside, within
from schemas.request import (
    DistillationRequest,
    GKDRequest,
    GRPORequest,
    OnlineDPORequest,
    PPORequest,
    ReferencedRequest,
    ReferenceModelSpec,
    RequestBase,
    RewardModelSpec,
    RLOORequest,
)


def policy_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    models = [("model.id", request.model.id), *((path, spec.id) for path, spec in other_models(request))]
    errors = hub_id_errors(request, models)
    for path, model_id in models:
        errors += _model_errors(path, model_id, settings)
    errors += _vllm_errors(request, settings)
    if request.model.trust_remote_code and not settings.allow_trust_remote_code:
        errors.append(
            FieldError(
                path="model.trust_remote_code",
                message="refused: this host does not allow remote code (allow_trust_remote_code)",
            )
        )
    dataset = request.dataset
    for prefix, source in dataset.sources():
        errors += _source_errors(prefix, source, settings)
    if settings.max_dataset_rows is not None:
        errors += _inline_rows_errors("dataset.rows", dataset.rows, settings.max_dataset_rows)
        carved = dataset.test_split_size
        if isinstance(carved, int) and carved > settings.max_dataset_rows:
            errors.append(
                FieldError(
                    path="dataset.test_split_size",
                    message=f"{carved} rows; this host allows at most {settings.max_dataset_rows} (max_dataset_rows)",
                )
            )
        if dataset.max_samples is not None and dataset.max_samples > settings.max_dataset_rows:
            errors.append(
                FieldError(
                    path="dataset.max_samples",
                    message=f"{dataset.max_samples}; this host allows at most "
                    f"{settings.max_dataset_rows} (max_dataset_rows)",
                )
            )
    errors += _task_suite_errors(request, settings)
    errors += _namespace_errors("output.repo_id", request.output.repo_id, settings)
    completions_repo = request.grpo.log_completions_hub_repo if isinstance(request, GRPORequest) else None
    if (
        completions_repo is not None
    ):  # TRL pushes completions there with the host's token: the same namespaces as the result
        errors += _namespace_errors("grpo.log_completions_hub_repo", completions_repo, settings, bare_name_ok=False)
    if (
        request.timeout_s is not None
        and settings.max_timeout_s is not None
        and request.timeout_s > settings.max_timeout_s
    ):
        errors.append(
            FieldError(
                path="timeout_s",
                message=f"{request.timeout_s} s; this host allows at most {settings.max_timeout_s} s (max_timeout_s)",
            )
        )
    if settings.max_gpus_per_job is not None and request.resources.gpus > settings.max_gpus_per_job:
        errors.append(
            FieldError(
                path="resources.gpus",
                message=f"{request.resources.gpus} GPUs; this host allows at most "
                f"{settings.max_gpus_per_job} per job (max_gpus_per_job)",
            )
        )
    errors += bound_errors(request, settings)
    errors += _class_errors(request, settings)
    for integration in request.training.report_to or []:
        if integration not in settings.allowed_report_to:
            errors.append(
                FieldError(
                    path="training.report_to",
                    message=f"{integration} is not allowed on this host "
                    f"(allowed_report_to: {settings.allowed_report_to})",
                )
            )
        # the tracker's host setting, named in TRACKER_HOSTS
        elif integration in TRACKER_HOSTS and getattr(settings, TRACKER_HOSTS[integration][0]) is None:
            setting, what = TRACKER_HOSTS[integration]
            errors.append(
                FieldError(
                    path="training.report_to", message=f"{integration}: this host has no {what} configured ({setting})"
                )
            )
    return errors


# A tracker whose place is the host's to give (never a request's): the setting that gives it.
TRACKER_HOSTS = {
    "mlflow": ("mlflow_tracking_uri", "MLflow tracking server"),
    "tensorboard": ("tensorboard_dir", "TensorBoard folder"),
    "trackio": ("trackio_dir", "Trackio folder"),
}


def _namespace_errors(path: str, repo_id: str, settings: Settings, *, bare_name_ok: bool = True) -> list[FieldError]:
    """A repo the job pushes to must be in one of the operator's allowed_output_namespaces (when set).
    A bare name (the token owner's own namespace) is refused where it would dodge the check."""
    namespace = repo_id.split("/")[0] if "/" in repo_id or bare_name_ok else None
    allowed = settings.allowed_output_namespaces
    if allowed and namespace not in allowed:
        shown = namespace or "the token's own (a name without a namespace)"
        return [
            FieldError(
                path=path,
                message=f"namespace {shown} is not allowed on this host (allowed_output_namespaces: {allowed})",
            )
        ]
    return []


def _source_errors(prefix: str, source: SourceSpec, settings: Settings) -> list[FieldError]:
    """A Hub id must match allowed_datasets (empty allows any); a URL must match allowed_dataset_urls
    and a local path must lie under allowed_local_dataset_roots, both empty (nothing allowed) until
    the operator opens them."""
    errors = []
    if source.id is not None and settings.allowed_datasets and not _matches(source.id, settings.allowed_datasets):
        errors.append(
            FieldError(
                path=f"{prefix}.id",
                message=f"{source.id} is not allowed on this host (allowed_datasets: {settings.allowed_datasets})",
            )
        )
    for path, location in source.locations():
        if _unpathable(location):
            errors.append(FieldError(path=f"{prefix}.{path}", message=UNPATHABLE))
            continue
        protocol, _ = fsspec.core.split_protocol(location)  # as the child's fsspec will read it
        if protocol is None:
            if not local_location_inside(location, settings.allowed_local_dataset_roots):
                roots = [str(root) for root in settings.allowed_local_dataset_roots] or "none configured"
                errors.append(
                    FieldError(
                        path=f"{prefix}.{path}",
                        message=f"local path {location} is outside allowed_local_dataset_roots ({roots})",
                    )
                )
        elif not _matches(location, settings.allowed_dataset_urls):
            allowed = settings.allowed_dataset_urls or "none configured"
            errors.append(
                FieldError(
                    path=f"{prefix}.{path}",
                    message=f"{location} is not allowed on this host (allowed_dataset_urls: {allowed})",
                )
            )
    return errors


def _task_suite_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    """An evaluation's `task` suite: a task the operator allows, on a host with its library, its rows
    from a source under the same rules (and row bound) as the training data."""
    errors = []
    for index, suite in enumerate(request.evaluation.suites if request.evaluation is not None else []):
        if not isinstance(suite, TaskSuite):
            continue
        prefix = f"evaluation.suites.{index}"
        if not _matches(suite.task, settings.allowed_evaluation_tasks):
            errors.append(
                FieldError(
                    path=f"{prefix}.task",
                    message=(
                        f"{suite.task} is not allowed on this host (allowed_evaluation_tasks: "
                        f"{settings.allowed_evaluation_tasks or 'none'})"
                    ),
                )
            )
        if library_version(suite.library) is None:
            errors.append(
                FieldError(
                    path=f"{prefix}.library",
                    message=f"{suite.library} is not installed on this host (adapterd's '{suite.library}' extra)",
                )
            )
        errors += _source_errors(f"{prefix}.source", suite.source, settings)
        errors += _inline_rows_errors(f"{prefix}.source.rows", suite.source.rows, settings.max_dataset_rows)
    return errors


def _inline_rows_errors(path: str, rows: list[Any] | None, bound: int | None) -> list[FieldError]:
    """Inline rows past the host's bound (max_dataset_rows), for the training data and a task suite alike."""
    if bound is None or rows is None or len(rows) <= bound:
        return []
    return [FieldError(path=path, message=f"{len(rows)} rows; this host allows at most {bound} (max_dataset_rows)")]


def report_to(request: RequestBase, settings: Settings) -> list[str]:
    """The TRL integrations a job reports to: the operator's, plus those the request asked for (policy permitting)."""
    return sorted({*settings.report_to, *(request.training.report_to or [])})


def _vllm_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    """vLLM's server mode goes only to the operator's server (vllm_server_base_url): a request asks for
    it only where the operator configured one. Naming a server is refused by the schema itself
    (`vllm_server_*` are in the refusal table, schemas/contract_rules.py)."""
    block = request.method  # a method's TRL fields are in the block named after it
    fields = request.method_config  # only the online methods' TRL configs have use_vllm and vllm_mode
    errors = []
    if (
        getattr(fields, "use_vllm", None)
        and getattr(fields, "vllm_mode", None) == "server"
        and settings.vllm_server_base_url is None
    ):
        errors.append(
            FieldError(
                path=f"{block}.vllm_mode",
                message="server: this host has no vLLM server configured "
                "(vllm_server_base_url); use vllm_mode 'colocate'",
            )
        )
    return errors


def other_models(request: RequestBase) -> list[tuple[str, RewardModelSpec | ReferenceModelSpec]]:
    """The models a request names besides its base (reward models, DPO's and KTO's reference,
    distillation's teacher, an evaluation's reward model), each under the same rules as the base."""
    found: list[tuple[str, RewardModelSpec | ReferenceModelSpec]] = []
    if isinstance(request, GRPORequest | RLOORequest | OnlineDPORequest) and request.rewards.model is not None:
        found.append(("rewards.model.id", request.rewards.model))
    if isinstance(request, PPORequest):
        found.append(("reward_model.id", request.reward_model))
    if isinstance(request, ReferencedRequest) and request.ref_model is not None:
        found.append(("ref_model.id", request.ref_model))
    if isinstance(request, DistillationRequest | GKDRequest):
        found.append(("teacher_model.id", request.teacher_model))
    for index, suite in enumerate(request.evaluation.suites if request.evaluation is not None else []):
        if isinstance(suite, RewardsSuite) and suite.model is not None:
            found.append((f"evaluation.suites.{index}.model.id", suite.model))
    return found


# What no path can hold: the OS refuses a NUL byte (Python raises ValueError before the call).
UNPATHABLE = "holds a NUL character (\\u0000), which no path can hold"


def _unpathable(location: str) -> bool:
    return "\x00" in location


def _model_errors(path: str, model_id: str, settings: Settings) -> list[FieldError]:
    if model_id.startswith("/"):
        if _unpathable(model_id):
            return [FieldError(path=path, message=UNPATHABLE)]
        if not within(model_id, settings.allowed_local_model_roots):
            roots = [str(root) for root in settings.allowed_local_model_roots] or "none configured"
            return [
                FieldError(path=path, message=f"local path {model_id} is outside allowed_local_model_roots ({roots})")
            ]
        return []
    if settings.allowed_models and not _matches(model_id, settings.allowed_models):
        return [
            FieldError(
                path=path, message=f"{model_id} is not allowed on this host (allowed_models: {settings.allowed_models})"
            )
        ]
    return []


def _matches(name: str, patterns: list[str]) -> bool:
    return any(fnmatchcase(name, pattern) for pattern in patterns)


def _class_errors(request: RequestBase, settings: Settings) -> list[FieldError]:
    """A class the fleet does not have: refused rather than run at a guessed priority."""
    if request.priority_class is None:
        return []
    names = [c.name for c in settings.priority_classes]
    if request.priority_class in names:
        return []
    known = f"one of {', '.join(names)}" if names else "none: this fleet has no priority classes (priority_classes)"
    return [FieldError(path="priority_class", message=f"unknown class {request.priority_class!r}; expected {known}")]
