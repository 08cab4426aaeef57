"""The `succeeded` event of a job, built in one place: for a push and what trained it, or for an
earlier run's Hub commit found by its request id (`FOUND_ON_THE_HUB`)."""

from __future__ import annotations

import math

from daemon.hub.push import PushResult
from daemon.jobs.job_events import JobEvents
from handlers.protocol import TrainResult
from schemas.evaluation import EvaluationReport, Published
from schemas.events import JobMemory, Succeeded
from schemas.request import RequestBase

# What an earlier run's Hub commit, found by its request id, tells of its training: nothing the
# daemon can vouch for (the metrics and versions were in that run's event).
FOUND_ON_THE_HUB = TrainResult(
    trainer="unknown: found by its Hub commit", metrics={}, base_model_revision=None, dataset_fingerprint=None, durations_s={}, versions={},
)


def _named_model(request: RequestBase, field: str) -> str | None:
    """The id of the model a request names in `field` (a dpo or kto `ref_model`, a distillation
    `teacher_model`); None where the method has none or the request left it out."""
    model = getattr(request, field, None)
    return model.id if model is not None else None


def succeeded_event(
    events: JobEvents, request: RequestBase, result: TrainResult, pushed: PushResult, durations: dict[str, float], *,
    duplicate: bool = False, report: EvaluationReport | None = None, published: Published = "main", memory: JobMemory | None = None,
) -> Succeeded:
    """`succeeded` for a push and what trained it (FOUND_ON_THE_HUB for a commit an earlier run made)."""
    return Succeeded(
        **events.common(),
        sink=pushed.sink,
        repo_id=pushed.repo_id,
        revision=pushed.revision,
        commit_sha=pushed.commit_sha,
        commit_url=pushed.commit_url,
        location=pushed.location,
        files=pushed.files,
        # JSON has no NaN or infinity; a metric without a finite value is left out, not sent as null.
        metrics={name: value for name, value in result.metrics.items() if math.isfinite(value)},
        durations_s=durations,
        versions=result.versions,
        method=request.method,
        trainer=result.trainer,
        base_model=request.model.id,
        base_model_revision=result.base_model_revision,
        ref_model=_named_model(request, "ref_model"),
        ref_model_revision=result.ref_model_revision,
        teacher_model=_named_model(request, "teacher_model"),
        teacher_model_revision=result.teacher_model_revision,
        dataset_fingerprint=result.dataset_fingerprint,
        dataset_sources=result.dataset_sources,
        tracking=result.tracking,
        duplicate=duplicate,
        published=published,
        pr_url=pushed.pr_url,
        evaluation=report,
        memory=memory,
    )
