"""What every command shares: the `--config` option, the request-file argument, and the reading of
settings, of a request file and of the broker, each failure said in one line with its exit code
(2 for settings, 1 for a request that is not valid or a broker that does not answer)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from aiokafka.errors import KafkaError

from daemon.errors import ConfigError
from daemon.settings import Settings, find_config, load_settings
from schemas import Rejection, RequestBase, decode_request

ConfigOption = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        help=(
            "TOML settings file; without it $ADAPTERD_CONFIG, then ./adapterd.toml, then /etc/adapterd/adapterd.toml."
        ),
    ),
]
# A request file: one that does not exist or cannot be read is a usage error (2), said without a traceback.
RequestFile = Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A request as JSON.")]
T = TypeVar("T")

# Which settings file the command read (settings.find_config's account of it), for the line that
# says a broker does not answer: the first thing to check is whether it read the file one meant.
_read_from: dict[str, str] = {}


def with_kafka(settings: Settings, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; a broker that does not answer ends the command with one line and exit 1, not a traceback."""
    # aiokafka logs each failed connection itself ("Unable connect to ..."); the command says it once, below.
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    done: list[T] = []

    async def kept_aside() -> None:
        # The result is kept out of the task: Python 3.11's asyncio.run formats the main task, result and
        # all, when it puts back the SIGINT handler (enum's lookup of a partial); `adapterd jobs --state
        # queued`'s result holds 12,000 events in a sweep-sized test, and printing them cost 0.5 s of CPU.
        done.append(await work)

    try:
        asyncio.run(kept_aside())
        return done[0]
    except KafkaError as exc:
        source = _read_from.get("source", "the built-in defaults")
        typer.echo(f"adapterd: Kafka at {settings.bootstrap_servers} (settings: {source}): {exc}", err=True)
        raise typer.Exit(1) from exc


def read_settings(config: Path | None) -> Settings:
    """The settings `--config` (or where find_config looks) names; bad settings end the command with exit 2."""
    try:
        path, _read_from["source"] = find_config(config)
        return load_settings(path)
    except ConfigError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc


def read_request(file: Path) -> RequestBase:
    """The request in `file`; one that is not valid ends the command with its errors, a line each, and exit 1."""
    # The daemon's credential rules, loaded here only: detect-secrets takes a third of a second to
    # import, which every other command (events, cancel, status) would pay.
    from daemon.admission.secret_rules import SCANNER

    decoded = decode_request(file.read_bytes(), scanner=SCANNER)
    if isinstance(decoded, Rejection):
        typer.echo(f"{file}: not a valid request ({decoded.reason}):", err=True)
        for error in decoded.errors:
            typer.echo(f"  {error.path or '(message)'}: {error.message}", err=True)
        raise typer.Exit(1)
    return decoded
