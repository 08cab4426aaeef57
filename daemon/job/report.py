"""What a succeeded job reports beside its event's common fields: the seconds each of its stages took
(the `succeeded` event's `durations_s`, each observed into the stage histogram) and its artifact's
model card (daemon/hub/model_card.py). Its memory is daemon/job/memory.py's; the event itself
is built by daemon/job/succeeded.py."""

from __future__ import annotations

import time
from pathlib import Path

from daemon.hub.model_card import CardContents, model_card
from daemon.ops.metrics import STAGE_SECONDS
from daemon.settings import Settings
from handlers.protocol import StartPoint, TrainResult
from schemas.evaluation import EvaluationReport
from schemas.request import RequestBase


def stage_durations(
    result: TrainResult,
    *,
    received_at: float,
    queued_s: float,
    started: float,
    push_started: float,
    first_step_at: float | None,
) -> dict[str, float]:
    """Its stages' seconds, now that it is pushed: queued (from `received_at`, wall-clock), the child's
    own, the push (from `push_started`), the total (from `started`, monotonic, plus the queue) and,
    when this attempt trained, the wait from its arrival to its first step."""
    durations = {
        "queue": round(queued_s, 3),
        **result.durations_s,
        "push": round(time.monotonic() - push_started, 3),
        "total": round(time.monotonic() - started + queued_s, 3),
    }
    if first_step_at is not None:
        durations["until_first_step"] = round(first_step_at - received_at, 3)
    for stage, seconds in durations.items():
        STAGE_SECONDS.labels(stage).observe(seconds)
    return durations


def write_card(
    artifact: Path,
    request: RequestBase,
    result: TrainResult,
    report: EvaluationReport | None,
    settings: Settings,
    start: StartPoint | None = None,
) -> None:
    """The artifact's README.md: its model card, from the request, the child's result and the gate's report."""
    contents = CardContents(
        request,
        result.trainer,
        result.base_model_revision,
        result.metrics,
        result.versions,
        dataset_sources=result.dataset_sources,
        dataset_fingerprint=result.dataset_fingerprint,
        pipeline_tag=result.pipeline_tag,
        tracking=result.tracking,
        evaluation=report,
        start=start,
    )
    (artifact / "README.md").write_text(model_card(contents, settings.local_model_hub_ids))
