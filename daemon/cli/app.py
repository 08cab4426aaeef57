"""The `adapterd` command line: run the daemon; submit, validate, follow and cancel requests; see a host's status; run the demo.

Exit codes, the same for every command: 0 done; 1 the request, the job or a service failed what was
asked (an invalid request, a job that did not succeed, a broker or daemon that does not answer);
2 a usage or configuration error (an unknown option, a file that cannot be read, bad settings).
"""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import sys
import urllib.request
from collections.abc import Coroutine
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from daemon.cli.console import follow_to_end
from daemon.cli.convert import convert_app
from daemon.errors import ConfigError
from daemon.kafka.event_reader import EventStream
from daemon.kafka.options import kafka_options
from daemon.ops.local_endpoint import local_url
from daemon.ops.logs import configure_logging
from daemon.settings import Settings, find_config, load_settings
from schemas import (
    Cancel,
    Rejection,
    RequestBase,
    decode_request,
)

app = typer.Typer(no_args_is_help=True, help="Run TRL post-training jobs from a Kafka stream. Exit codes: 0 done, 1 failed, 2 usage or configuration error.")

ConfigOption = Annotated[Path | None, typer.Option("--config", "-c", help=(
    "TOML settings file; without it $ADAPTERD_CONFIG, then ./adapterd.toml, then /etc/adapterd/adapterd.toml."))]
# A request file: one that does not exist or cannot be read is a usage error (2), said without a traceback.
RequestFile = Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="A request as JSON.")]
T = TypeVar("T")


def _show_version(shown: bool) -> None:
    if shown:
        typer.echo(f"adapterd {installed_version('adapterd')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit.")] = False,
) -> None:
    """Run TRL post-training jobs from a Kafka stream."""


# Which settings file the command read (settings.find_config's account of it), for the line that
# says a broker does not answer: the first thing to check is whether it read the file one meant.
_read_from: dict[str, str] = {}


def _with_kafka(settings: Settings, work: Coroutine[Any, Any, T]) -> T:
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


def _settings(config: Path | None) -> Settings:
    try:
        path, _read_from["source"] = find_config(config)
        return load_settings(path)
    except ConfigError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc


def _read_request(file: Path) -> RequestBase:
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

    try:
        asyncio.run(main())
    except (ConfigError, LookupError) as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    except KafkaError as exc:
        typer.echo(f"adapterd: Kafka at {settings.bootstrap_servers}: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command()
def validate(
    file: RequestFile,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="Also judge it by this host's settings (policy, bounds, GPUs), as its daemon would.")] = None,
) -> None:
    """Check a request file against the schema, without publishing it; exit 1 when it is not valid."""
    request = _read_request(file)
    if config is not None:
        from daemon.cli.host_check import host_check

        host_check(request, config, str(file))
    typer.echo(f"{file}: valid {request.method} request {request.request_id}" + (f", and {config} would take it" if config else ""))


@app.command()
def submit(
    file: RequestFile,
    config: ConfigOption = None,
    wait: Annotated[bool, typer.Option("--wait", help="Follow the request's events; exit 0 on succeeded, 1 otherwise.")] = False,
) -> None:
    """Validate a request file and publish it to the requests topic, keyed by its request id."""
    request = _read_request(file)
    settings = _settings(config)

    async def publish() -> int:
        async with EventStream(settings, from_end=True) as stream:  # positioned before the request exists
            producer = AIOKafkaProducer(**kafka_options(settings), acks="all", enable_idempotence=True)
            try:
                await producer.start()
                meta = await producer.send_and_wait(
                    settings.requests_topic, request.model_dump_json(exclude_unset=True).encode(), key=request.request_id.encode()
                )
            finally:
                await producer.stop()
            typer.echo(f"submitted {request.request_id} to {meta.topic}[{meta.partition}]@{meta.offset}")
            if not wait:
                return 0
            return await follow_to_end(stream, request.request_id)

    raise typer.Exit(_with_kafka(settings, publish()))


@app.command()
def events(
    config: ConfigOption = None,
    request_id: Annotated[str | None, typer.Option("--request-id", help="Only this request's events.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until interrupted.")] = False,
) -> None:
    """Print lifecycle events as JSON lines: those already published, then new ones with --follow."""
    settings = _settings(config)

    async def read() -> None:
        async with EventStream(settings) as stream:
            async for event in stream.events(request_id, until_terminal=False, follow=follow):
                typer.echo(event.model_dump_json())

    try:
        _with_kafka(settings, read())
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a --follow ends: the reader is closed, and that is success


@app.command()
def jobs(
    config: ConfigOption = None,
    state: Annotated[list[str] | None, typer.Option("--state", help="Only requests in this state (queued, running, succeeded, failed, cancelled, rejected); repeatable.")] = None,
    method: Annotated[str | None, typer.Option(help="Only requests of this method.")] = None,
    host: Annotated[str | None, typer.Option(help="Only requests whose latest event came from this host.")] = None,
    since: Annotated[str | None, typer.Option(help="Only requests with an event in this past age: 30m, 2h, 7d.")] = None,
    slots: Annotated[int | None, typer.Option(min=1, help=(
        "The fleet's slots, for the ETAs of --state queued with priority classes; default: the hosts that started a job in the "
        "last 24 hours, counted one slot each (a guess: hosts with more slots make the ETAs too long). Without classes each "
        "partition is its own queue, and its ETAs follow its running job."))] = None,
) -> None:
    """Every request's latest state across the fleet, from the events topic; newest last. --state queued lists every
    waiting request, read from the queues themselves, in the fleet's order: its class, team, place, ETA and where it waits."""
    from datetime import UTC, datetime

    from daemon.cli.jobs import HEADER, STATES, age, fold, history

    settings = _settings(config)
    unknown = sorted(set(state or []) - set(STATES))
    if unknown:
        typer.echo(f"adapterd: --state: {', '.join(unknown)} is not a state; one of {', '.join(STATES)}", err=True)
        raise typer.Exit(2)
    try:
        within = age(since) if since is not None else None
    except ValueError as exc:
        typer.echo(f"adapterd: --since: {exc}", err=True)
        raise typer.Exit(2) from exc

    now = datetime.now(UTC)
    events = _with_kafka(settings, history(settings))
    others = [each for each in state or [] if each != "queued"]
    listed = [job for job in fold(events).values()
              if (not state or job.state in others) and (method is None or job.method == method) and (host is None or job.host == host)
              and (within is None or now - job.last <= within)]
    if not state or others:
        typer.echo(HEADER)
        for job in sorted(listed, key=lambda job: job.last):
            typer.echo(job.line(now))
    if state and "queued" in state:
        from daemon.cli.places import placed_backlog, queue_table

        if others:
            typer.echo()  # the waiting requests are a table of their own, with their own columns
        backlog, placed = _with_kafka(settings, placed_backlog(settings, slots, now, events))
        for topic in backlog.missing:
            typer.echo(f"adapterd: topic {topic} does not exist; nothing waits there", err=True)
        for line in queue_table(placed, method, host, within, now):
            typer.echo(line)


@app.command()
def get(
    request_id: str,
    config: ConfigOption = None,
    slots: Annotated[int | None, typer.Option(min=1, help="The fleet's slots, for a waiting request's ETA (as in `adapterd jobs`).")] = None,
) -> None:
    """One request's whole history, event by event, and where it stands; a waiting one's place, ETA and where it waits;
    exit 1 when it has no events and waits nowhere."""
    from datetime import UTC, datetime

    from daemon.cli.console import describe
    from daemon.cli.jobs import fold, history
    from daemon.cli.places import waiting_line

    settings = _settings(config)
    events = _with_kafka(settings, history(settings))
    mine = [event for event in events if event.request_id == request_id]
    waits = None  # where it waits, when its events do not say it runs or ended: read from the queues themselves
    if not mine or fold(mine)[request_id].state == "queued":
        waits = _with_kafka(settings, waiting_line(settings, request_id, slots, datetime.now(UTC), events))
    if not mine and waits is None:
        typer.echo(f"adapterd: no events for {request_id} in {settings.events_topic}, and it waits in none of the queues", err=True)
        raise typer.Exit(1)
    events = mine
    last_progress = max((index for index, event in enumerate(events) if event.type == "progress"), default=None)
    for index, event in enumerate(events):
        if event.type == "progress" and index != last_progress:
            continue  # one line a step would bury the rest: the latest is shown
        typer.echo(describe(event) + (f" (step {event.step}/{event.total_steps})" if event.type == "progress" else ""))
    if events:
        job = fold(events)[request_id]
        typer.echo(f"{request_id}: {job.state}, method {job.method or '-'}, attempt {job.attempt}, on {job.host}" + (f"; {job.detail}" if job.detail else ""))
    if waits is not None:
        typer.echo(waits)


@app.command()
def logs(
    request_id: str,
    config: ConfigOption = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing the log as it grows, until the request ends.")] = False,
) -> None:
    """The trainer's log of a request, from whichever host runs or ran it (its endpoint, with the fleet's logs_token)."""
    from daemon.cli.logs import LogsError, show_log

    settings = _settings(config)

    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    try:
        _with_kafka(settings, show_log(settings, request_id, follow, write))
    except LogsError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(1) from exc


@app.command()
def cancel(
    request_id: Annotated[str | None, typer.Argument(help="The request to cancel; or leave it out and sweep by --team, --class, --selector.")] = None,
    config: ConfigOption = None,
    reason: Annotated[str, typer.Option(help="Why; echoed in the cancelled event.")] = "cancelled by an operator",
    team: Annotated[str | None, typer.Option(help="Sweep: every waiting or running request of this team.")] = None,
    priority_class: Annotated[str | None, typer.Option("--class", help="Sweep: ... of this priority class.")] = None,
    selector: Annotated[list[str] | None, typer.Option(help="Sweep: ... whose metadata has key=value; repeatable, all must match.")] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what would be cancelled, and send nothing.")] = False,
) -> None:
    """Cancel a request on whichever host holds it: a running job stops, a queued one is skipped; one that ended is left (nothing sent).
    Or a sweep: every waiting and running request that matches --team, --class and each --selector, counted and listed."""
    from daemon.cli.cancel import cancel as send_cancel
    from daemon.cli.sweep import selector as sweep_selector
    from daemon.cli.sweep import sweep
    from daemon.errors import UsageError

    settings = _settings(config)
    if request_id is None or team or priority_class or selector:
        try:
            if request_id is not None:
                raise UsageError("cancel: a request id or a sweep (--team, --class, --selector), not both")
            chosen = sweep_selector(settings, team, priority_class, selector or [])
        except UsageError as exc:
            typer.echo(f"adapterd: {exc}", err=True)
            raise typer.Exit(2) from exc
        for line in _with_kafka(settings, sweep(settings, chosen, reason, dry_run)):
            typer.echo(line)
        return
    try:
        message = Cancel(request_id=request_id, reason=reason)
    except ValidationError as exc:
        typer.echo(f"adapterd: not a request id: {request_id!r}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(_with_kafka(settings, send_cancel(settings, message, dry_run=dry_run)))


@app.command()
def status(
    config: ConfigOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the daemon's /status document as it is.")] = False,
) -> None:
    """What the daemon on this host is running (read from its metrics_address)."""
    settings = _settings(config)
    if not settings.metrics_address:
        typer.echo("adapterd: metrics_address is switched off, so the daemon's status cannot be read", err=True)
        raise typer.Exit(2)
    url, tls = local_url(settings, "/status")
    try:
        with urllib.request.urlopen(url, timeout=10, context=tls) as response:
            document = json.load(response)
    except OSError as exc:
        typer.echo(f"adapterd: no daemon answers at {url}: {exc}", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        typer.echo(json.dumps(document, indent=2))
        return
    slots = document["slots"]
    typer.echo(f"host {document['host']}, group {document['group_id']}: {slots['busy']} of {slots['total']} slot(s) busy")
    packing = document.get("packing")
    for gpu, held in (packing or {}).get("gpus", {}).items():
        typer.echo(f"  GPU {gpu}: {held['jobs']} of {packing['max_jobs_per_gpu']} job(s), "
                   f"{held['reserved_bytes'] / 2**30:.1f} of {packing['usable_bytes'] / 2**30:.1f} GiB held by their shares")
    for job in document["jobs"]:
        step = f", step {job['step']}/{job['total_steps']}" if job.get("step") is not None else ""
        share = job.get("memory_share_bytes")
        held = f", share {share / 2**30:.1f} GiB" if share else ""
        typer.echo(f"  {job['request_id']}  {job['method']}  slot {job['slot']}{held}  {job['stage']}{step}")


@app.command()
def doctor(config: ConfigOption = None) -> None:
    """Check this host before it takes work: Kafka, the topics, who may write the events topic, the Hub token, GPUs, disk, a running daemon; exit 1 on a failure."""
    from daemon.cli.doctor import examine

    settings = _settings(config)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the kafka check says what aiokafka would log
    found = asyncio.run(examine(settings))
    for check in found:
        typer.echo(check.line())
    raise typer.Exit(1 if any(check.ok is False for check in found) else 0)


@app.command()
def keys(
    folder: Annotated[Path, typer.Argument(help="Where event-signing-key.pem (owner-only) and event-verify-key.pub go.")],
) -> None:
    """Make a key pair for signed events: the private key for each host's event_signing_key_file, the public key for readers' event_verify_keys."""
    from daemon.cli.keys import PRIVATE_NAME, PUBLIC_NAME, make_key_pair
    from daemon.errors import UsageError

    try:
        key_id, public = make_key_pair(folder)
    except UsageError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(f"key {key_id}: private key {folder / PRIVATE_NAME} (event_signing_key_file), public key {folder / PUBLIC_NAME}")
    typer.echo(f"event_verify_keys = [\"{public}\"]")


@app.command()
def topics(
    config: ConfigOption = None,
    partitions: Annotated[int, typer.Option(help="Partitions of each topic; at least the fleet's GPU slots.")] = 1,
    replication_factor: Annotated[int, typer.Option(help="Replicas of each partition (3 on a production cluster).")] = 1,
) -> None:
    """Create the requests, events, DLQ and control topics where they are missing."""
    from daemon.kafka.topics import ensure_topics

    settings = _settings(config)
    _with_kafka(settings, ensure_topics(settings, partitions=partitions, replication_factor=replication_factor))
    typer.echo(f"topics ready: {settings.requests_topic}, {settings.events_topic}, {settings.dlq_topic}, {settings.control_topic}")


@app.command()
def methods() -> None:
    """List the training methods, the TRL trainer of each, and whether this host's TRL can run it."""
    from daemon.admission.capabilities import trl_version, unsupported_reason
    from schemas.methods import METHODS

    typer.echo(f"trl {trl_version()}")
    rows = [(name, method.trainer, method.status) for name, method in METHODS.items()]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]  # aligned whatever the longest name
    for name, trainer, stage in rows:
        reason = unsupported_reason(name)
        status = "available" if reason is None else f"unavailable: {reason}"
        typer.echo(f"  {name:<{widths[0]}}  {trainer:<{widths[1]}}  {stage:<{widths[2]}}  {status}")


@app.command()
def schema(
    which: Annotated[Literal["request", "event", "control"] | None, typer.Argument(help="One schema; all three when left out.")] = None,
) -> None:
    """Print the JSON Schemas of requests, events and control messages (schemas/json/)."""
    from schemas.generated import json_schemas

    schemas = json_schemas()
    typer.echo(json.dumps(schemas if which is None else schemas[f"{which}.schema.json"], indent=2))


app.add_typer(convert_app, name="convert")


@app.command()
def demo(
    work_dir: Annotated[Path, typer.Option(help="Where the broker, the tiny model and the adapter go.")] = Path("adapterd-demo"),
    method: Annotated[str, typer.Option(help="The training method to show (see `adapterd methods`), or sft-vision, dpo-vision, grpo-vision, grpo-math (GRPO on sums, TRL's accuracy reward).")] = "sft",
    gate: Annotated[bool, typer.Option(help="Two SFT requests judged before publishing: one passes its gate; one, on the tiny model poisoned with NaN, fails it.")] = False,
    keep: Annotated[bool, typer.Option(help="Leave the broker and the daemon running afterwards, to try submit, jobs, get, events and cancel against them; Ctrl-C stops both.")] = False,
) -> None:
    """Run the main job on built-in defaults: local broker, tiny model, one request (SFT unless --method), local output."""
    from daemon.cli.demo import main

    sys.exit(main(work_dir, method, gate, keep))


if __name__ == "__main__":
    app()
