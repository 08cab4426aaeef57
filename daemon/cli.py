"""The `adapterd` command line: run the daemon, submit and validate requests, run the demo."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaProducer

from daemon.errors import ConfigError
from daemon.logs import configure_logging
from daemon.settings import Settings, load_settings
from schemas import Rejection, RequestBase, decode_request

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Run TRL post-training jobs from a Kafka stream.")

ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help="TOML settings file (or $ADAPTERD_CONFIG).")]


def _settings(config: Path | None) -> Settings:
    try:
        return load_settings(config)
    except ConfigError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc


def _read_request(file: Path) -> RequestBase:
    decoded = decode_request(file.read_bytes())
    if isinstance(decoded, Rejection):
        typer.echo(f"{file}: not a valid request ({decoded.reason}):", err=True)
        for error in decoded.errors:
            typer.echo(f"  {error.path or '(message)'}: {error.message}", err=True)
        raise typer.Exit(2)
    return decoded


@app.command()
def run(config: ConfigOption = None) -> None:
    """Run the daemon until SIGTERM or SIGINT."""
    from daemon.service import Service

    settings = _settings(config)
    configure_logging(settings.log_format, settings.log_level)

    async def main() -> None:
        service = Service(settings)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, service.request_stop)
        await service.run()

    asyncio.run(main())


@app.command()
def validate(file: Path) -> None:
    """Check a request file against the schema, without publishing it."""
    request = _read_request(file)
    typer.echo(f"{file}: valid {request.method} request {request.request_id}")


@app.command()
def submit(file: Path, config: ConfigOption = None) -> None:
    """Validate a request file and publish it to the requests topic, keyed by its request id."""
    request = _read_request(file)
    settings = _settings(config)

    async def publish() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks="all", enable_idempotence=True)
        await producer.start()
        try:
            meta = await producer.send_and_wait(
                settings.requests_topic, request.model_dump_json(exclude_unset=True).encode(), key=request.request_id.encode()
            )
        finally:
            await producer.stop()
        typer.echo(f"submitted {request.request_id} to {meta.topic}[{meta.partition}]@{meta.offset}")

    asyncio.run(publish())


@app.command()
def methods() -> None:
    """List the training methods and whether this host's TRL can run each."""
    from daemon.capabilities import trl_version, unsupported_reason
    from schemas import REQUEST_MODELS

    typer.echo(f"trl {trl_version()}")
    for method, model in REQUEST_MODELS.items():
        reason = unsupported_reason(method)
        status = "available" if reason is None else f"unavailable: {reason}"
        typer.echo(f"  {method:<7} {'experimental ' if model.experimental else ''}{status}")


@app.command()
def schema() -> None:
    """Print the JSON Schemas of requests and events."""
    from schemas.jsonschema import generated_schemas

    typer.echo(json.dumps({name: json.loads(text) for name, text in generated_schemas().items()}, indent=2))


@app.command()
def demo(
    work_dir: Annotated[Path, typer.Option(help="Where the broker, the tiny model and the adapter go.")] = Path("adapterd-demo"),
) -> None:
    """Run the main job on built-in defaults: local broker, tiny model, one SFT request, local output."""
    from daemon.demo import main

    sys.exit(main(work_dir))


if __name__ == "__main__":
    app()
