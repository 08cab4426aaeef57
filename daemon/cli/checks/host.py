"""A valid request judged by a host's settings as that host's daemon would judge it (its policy, its
bounds, its GPUs, its memory plan, inline images): for `adapterd validate -c` and `adapterd convert trl-config -c`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from daemon.admission.judge import refusal
from daemon.errors import ConfigError
from daemon.resources.estimator import Estimator, MemoryHistory
from daemon.resources.shards import Unfit, planned
from daemon.resources.slots import Slots, slots_of
from daemon.settings import Settings, load_settings
from schemas import Rejection, RequestBase


def host_check(request: RequestBase, config: Path, what: str) -> str:
    """Say each field the host refuses and exit 1; exit 2 on settings that do not load; when it would take it,
    return how its job would run there (its memory plan), or '' where the host has nothing to plan it by."""
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    slots = slots_of(settings)
    refused = refusal(request, settings, slots)
    if refused is None:
        try:
            return plan_said(request, settings, slots)
        except Unfit as unfit:
            refused = unfit.rejection
    say_refused(refused, config, what)
    raise typer.Exit(1)


def plan_said(request: RequestBase, settings: Settings, slots: Slots) -> str:
    """The memory plan the daemon would make (daemon/resources/shards.py), from the same estimator, its models'
    headers read as the daemon reads them, and the history in its work_dir; raises Unfit as the daemon would
    reject it. '' where the GPUs' memory or the estimate is unknown: the job would run as it asks."""
    if slots.gpu_room is None:
        return ""
    estimator = Estimator(settings, MemoryHistory.load(settings.work_dir / "memory.json"))
    whole = asyncio.run(estimator.need(request))
    plan = planned(request, whole, estimator, slots.gpu_room, slots.most_per_job())
    if plan.estimate is None:
        return ""
    gpus = plan.request.resources.gpus
    how = (
        f"sharded across its {gpus} GPUs"
        if plan.request.resources.shard == "fsdp"
        else "a whole copy on each of its GPUs"
        if gpus > 1
        else "on one GPU"
    )
    return f"{how}, {plan.estimate.needed / 1e9:.1f} GB a GPU of the {slots.gpu_room / 1e9:.1f} GB each holds for jobs"


def say_refused(refused: Rejection, config: Path, what: str) -> None:
    typer.echo(f"{what}: valid, but {config} refuses it ({refused.reason}):", err=True)
    for error in refused.errors:
        typer.echo(f"  {error.path or '(request)'}: {error.message}", err=True)
