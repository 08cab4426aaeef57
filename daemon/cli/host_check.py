"""A valid request judged by a host's settings as that host's daemon would judge it (its policy, its
bounds, its GPUs, inline images): for `adapterd validate -c` and `adapterd convert trl-config -c`."""

from __future__ import annotations

from pathlib import Path

import typer

from daemon.admission.judge import refusal
from daemon.errors import ConfigError
from daemon.jobs.slots import Slots, discover_gpus
from daemon.settings import load_settings
from schemas import RequestBase


def host_check(request: RequestBase, config: Path, what: str) -> None:
    """Say each field the host refuses and exit 1; exit 2 on settings that do not load; return when it would take it."""
    try:
        settings = load_settings(config)
    except ConfigError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    refused = refusal(request, settings, Slots(discover_gpus(settings.gpus), settings.job_slots))
    if refused is not None:
        typer.echo(f"{what}: valid, but {config} refuses it ({refused.reason}):", err=True)
        for error in refused.errors:
            typer.echo(f"  {error.path or '(request)'}: {error.message}", err=True)
        raise typer.Exit(1)
