"""The commands that send requests in: `validate`, `submit` and `cancel` (one request, or a sweep), and `hold`,
`release`, `pause`, `resume` (one request)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from aiokafka import AIOKafkaProducer
from pydantic import ValidationError

from daemon.cli.console import follow_to_end
from daemon.cli.options import ConfigOption, RequestFile, read_request, read_settings, with_kafka
from daemon.kafka.event_reader import EventStream
from daemon.kafka.options import kafka_options
from schemas import Cancel


def validate(
    file: RequestFile,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            help="Also judge it by this host's settings (policy, bounds, GPUs, memory plan), as its daemon would.",
        ),
    ] = None,
) -> None:
    """Check a request file against the schema, without publishing it; exit 1 when it is not valid."""
    request = read_request(file)
    said = ""
    if config is not None:
        from daemon.cli.checks.host import host_check

        plan = host_check(request, config, str(file))
        said = f", and {config} would take it" + (f": {plan}" if plan else "")
    typer.echo(f"{file}: valid {request.method} request {request.request_id}{said}")


def submit(
    file: RequestFile,
    config: ConfigOption = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Follow the request's events; exit 0 on succeeded, 1 otherwise.")
    ] = False,
    key: Annotated[
        Path | None,
        typer.Option("--key", help="The team's private key to sign the request with; default: producer_key_file."),
    ] = None,
) -> None:
    """Validate a request file and publish it to the requests topic, keyed by its request id, signed with the
    team's key when there is one."""
    request = read_request(file)
    settings = read_settings(config)
    value = request.model_dump_json(exclude_unset=True).encode()
    headers = producer_signed(value, key, settings.producer_key_file)

    async def publish() -> int:
        async with EventStream(settings, from_end=True) as stream:  # positioned before the request exists
            producer = AIOKafkaProducer(**kafka_options(settings), acks="all", enable_idempotence=True)
            try:
                await producer.start()
                meta = await producer.send_and_wait(
                    settings.requests_topic, value, key=request.request_id.encode(), headers=headers
                )
            finally:
                await producer.stop()
            typer.echo(f"submitted {request.request_id} to {meta.topic}[{meta.partition}]@{meta.offset}")
            if not wait:
                return 0
            return await follow_to_end(stream, request.request_id)

    raise typer.Exit(with_kafka(settings, publish()))


def producer_signed(value: bytes, key: Path | None, setting: Path | None) -> list[tuple[str, bytes]]:
    """The producer's signature header over exactly `value`, with `--key` or else `producer_key_file`; none without
    either. A key that cannot be read ends the command (exit 2), naming the flag or setting."""
    from schemas.signing import EventSigner, producer_headers

    path, name = (key, "--key") if key is not None else (setting, "producer_key_file")
    if path is None:
        return []
    try:
        signer = EventSigner.from_file(path)
    except (OSError, ValueError) as exc:
        typer.echo(
            f"adapterd: {name}: {path}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}", err=True
        )
        raise typer.Exit(2) from exc
    return producer_headers(signer, value)


def cancel(
    request_id: Annotated[
        str | None,
        typer.Argument(help="The request to cancel; or leave it out and sweep by --team, --class, --selector."),
    ] = None,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option(help="Why; echoed in the cancelled event.")] = "cancelled by an operator",
    team: Annotated[str | None, typer.Option(help="Sweep: every waiting or running request of this team.")] = None,
    priority_class: Annotated[str | None, typer.Option("--class", help="Sweep: ... of this priority class.")] = None,
    selector: Annotated[
        list[str] | None, typer.Option(help="Sweep: ... whose metadata has key=value; repeatable, all must match.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be cancelled, and send nothing.")] = False,
) -> None:
    """Cancel a request on whichever host holds it: a running job stops, a queued one is skipped; one that ended is left
    (nothing sent). Or a sweep: every waiting and running request that matches --team, --class and each --selector,
    counted and listed."""
    from daemon.cli.cancel import cancel as send_cancel
    from daemon.cli.sweep import selector as sweep_selector
    from daemon.cli.sweep import sweep
    from daemon.errors import UsageError

    settings = read_settings(config)
    if request_id is None or team or priority_class or selector:
        try:
            if request_id is not None:
                raise UsageError("cancel: a request id or a sweep (--team, --class, --selector), not both")
            chosen = sweep_selector(settings, team, priority_class, selector or [])
        except UsageError as exc:
            typer.echo(f"adapterd: {exc}", err=True)
            raise typer.Exit(2) from exc
        for line in with_kafka(settings, sweep(settings, chosen, reason, dry_run)):
            typer.echo(line)
        return
    try:
        message = Cancel(request_id=request_id, reason=reason)
    except ValidationError as exc:
        typer.echo(f"adapterd: not a request id: {request_id!r}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(with_kafka(settings, send_cancel(settings, message, dry_run=dry_run)))


RequestId = Annotated[str, typer.Argument(help="The request's id.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Say what would happen, and send nothing.")]


def _send_hold(kind: str, request_id: str, config: Path | None, reason: str, dry_run: bool) -> None:
    """A hold, release, pause or resume of one request (daemon/cli/holds.py)."""
    from daemon.cli.holds import send
    from schemas import Hold, Pause, Release, Resume

    settings = read_settings(config)
    models: dict[str, type[Hold | Release | Pause | Resume]] = {
        "hold": Hold,
        "release": Release,
        "pause": Pause,
        "resume": Resume,
    }
    model = models[kind]
    try:
        message = model(request_id=request_id, reason=reason)
    except ValidationError as exc:
        typer.echo(f"adapterd: not a request id: {request_id!r}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(with_kafka(settings, send(settings, message, dry_run=dry_run)))


def hold(
    request_id: RequestId,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option(help="Why; echoed in the held event.")] = "held by an operator",
    dry_run: DryRun = False,
) -> None:
    """Hold a waiting request: it is not started until `adapterd release` (the requests behind it go first). A running
    job is left to run; `adapterd pause` stops it."""
    _send_hold("hold", request_id, config, reason, dry_run)


def release(
    request_id: RequestId,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option(help="Why; echoed in the released event.")] = "released by an operator",
    dry_run: DryRun = False,
) -> None:
    """Release a held or paused request: it waits as any other and starts (from its checkpoint) when reached."""
    _send_hold("release", request_id, config, reason, dry_run)


def pause(
    request_id: RequestId,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option(help="Why; echoed in the paused event.")] = "paused by an operator",
    dry_run: DryRun = False,
) -> None:
    """Pause a request: a running job stops at a checkpoint, no attempt spent, and waits held until `adapterd resume`;
    a waiting one is held."""
    _send_hold("pause", request_id, config, reason, dry_run)


def resume(
    request_id: RequestId,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option(help="Why; echoed in the released event.")] = "resumed by an operator",
    dry_run: DryRun = False,
) -> None:
    """Resume a paused (or held) request: the next host to reach it resumes it from its checkpoint."""
    _send_hold("resume", request_id, config, reason, dry_run)
