"""The `succeeded` event of a job, built in one place: for a push and what trained it, or for an
earlier run's Hub commit found by its request id (`FOUND_ON_THE_HUB`); and an earlier attempt's
found again (`earlier_success`), so a request that already succeeded is answered, marked duplicate."""

from __future__ import annotations

import math

from pydantic import ValidationError
from structlog.typing import FilteringBoundLogger

from daemon import executors
from daemon.hub import push as hub_push
from daemon.hub.push import PushResult
from daemon.job.events import JobEvents
from daemon.job.uploads import CheckpointUploads
from daemon.settings import Settings
from daemon.store.journal import Journal
from handlers.protocol import TrainResult
from schemas.evaluation import EvaluationReport, Published
from schemas.events import JobMemory, Succeeded
from schemas.request import DistillationRequest, GKDRequest, ReferencedRequest, RequestBase

# What an earlier run's Hub commit, found by its request id, tells of its training: nothing the
# daemon can vouch for (the metrics and versions were in that run's event).
FOUND_ON_THE_HUB = TrainResult(
    trainer="unknown: found by its Hub commit",
    metrics={},
    base_model_revision=None,
    dataset_fingerprint=None,
    durations_s={},
    versions={},
)


def _ref_model(request: RequestBase) -> str | None:
    """The id of a dpo or kto request's `ref_model`; None where the method has none or the request left it out."""
    return request.ref_model.id if isinstance(request, ReferencedRequest) and request.ref_model is not None else None


def _teacher_model(request: RequestBase) -> str | None:
    """The id of a distillation or gkd request's `teacher_model`; None for every other method."""
    return request.teacher_model.id if isinstance(request, DistillationRequest | GKDRequest) else None


def succeeded_event(
    events: JobEvents,
    request: RequestBase,
    result: TrainResult,
    pushed: PushResult,
    durations: dict[str, float],
    *,
    duplicate: bool = False,
    report: EvaluationReport | None = None,
    published: Published = "main",
    memory: JobMemory | None = None,
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
        ref_model=_ref_model(request),
        ref_model_revision=result.ref_model_revision,
        teacher_model=_teacher_model(request),
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


async def earlier_success(
    request: RequestBase,
    settings: Settings,
    journal: Journal,
    uploads: CheckpointUploads,
    events: JobEvents,
    log: FilteringBoundLogger,
) -> Succeeded | None:
    """This request's `succeeded` again, marked duplicate, when an earlier attempt got that far:
    from this host's journal, the checkpoint store (an attempt on another host; only what the fleet
    signed there for this request), or the Hub commit that records the request id."""
    recorded, found_in = journal.read().get("succeeded"), "journal"
    if recorded is None:
        recorded, found_in = await uploads.earlier_success(), "store"
    if recorded is not None:
        try:
            earlier = Succeeded.model_validate(recorded)
        except (
            ValidationError
        ) as exc:  # signed, yet no event of this schema (another version's): never a reason to fail the request
            log.warning("job.earlier_success_unreadable", found_in=found_in, error=str(exc)[:500])
        else:
            log.info("job.duplicate", commit_sha=earlier.commit_sha, found_in=found_in)
            return Succeeded(
                **{**earlier.model_dump(exclude={"event_id", "time"}), **events.common(), "duplicate": True}
            )
    found = await executors.run("hub", hub_push.find_commit, request, settings)
    if found is None:
        return None
    log.info("job.duplicate", commit_sha=found.commit_sha, found_in="hub")
    published: Published = "pr" if found.pr_url else "main" if found.revision == request.output.revision else "branch"
    return succeeded_event(events, request, FOUND_ON_THE_HUB, found, {}, duplicate=True, published=published)
