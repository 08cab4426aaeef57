"""The commands that run and look after this host's daemon: `run`, `status`, `doctor`, `topics` and `keys`."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import urllib.request
from pathlib import Path
from typing import Annotated

import typer
from aiokafka.errors import KafkaError

from daemon.cli.listing import CHECK_FIELDS
from daemon.cli.options import ConfigOption, read_settings, with_kafka
from daemon.errors import ConfigError
from daemon.ops.local_endpoint import local_url
from daemon.ops.logs import configure_logging


def run(config: ConfigOption = None) -> None:
    """Run the daemon until SIGTERM or SIGINT."""
    from daemon.decoding import scanner
    from daemon.service import Service

    settings = read_settings(config)
    configure_logging(settings.log_format, settings.log_level)
    # The credential rules (detect-secrets' import and one RE2 automaton: 0.4 s) built before the loop runs, rather than
    # in the service's construction on it, where they held it before anything else could run.
    scanner()

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


def status(
    config: ConfigOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print the daemon's /status document as it is, one JSON object: host, group_id, gpus, gpu_kind, "
            "gpu_memory_gib, slots (total, "
            "busy, free), packing, jobs (each with request_id, method, slot, stage, pid, child, memory_share_bytes, "
            "memory_estimate_bytes, step, total_steps, eta_s once it trains, partition, offset), children.",
        ),
    ] = False,
) -> None:
    """What the daemon on this host is running (read from its metrics_address): its slots, each GPU's jobs with
    packing, and a table of its jobs."""
    from daemon.cli.listing import Column, show_json, show_table

    settings = read_settings(config)
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
        show_json(document)
        return
    slots = document["slots"]
    kind, memory = document.get("gpu_kind"), document.get("gpu_memory_gib")  # absent from a daemon before kinds
    said = f"; GPUs {kind}" + (f", {memory:g} GiB each" if memory else "") if kind else ""
    typer.echo(
        f"host {document['host']}, group {document['group_id']}: {slots['busy']} of {slots['total']} slot(s) busy"
        + said
    )
    packing = document.get("packing")
    for gpu, held in (packing or {}).get("gpus", {}).items():
        typer.echo(
            f"  GPU {gpu}: {held['jobs']} of {packing['max_jobs_per_gpu']} job(s), "
            f"{held['reserved_bytes'] / 2**30:.1f} of {packing['usable_bytes'] / 2**30:.1f} GiB held by their shares"
        )
    if not document["jobs"]:
        return  # nothing runs: the slots' line says so
    rows = []
    for job in document["jobs"]:
        share = job.get("memory_share_bytes")
        step = f"{job['step']}/{job['total_steps']}" if job.get("step") is not None else "-"
        rows.append(
            [
                job["request_id"],
                job["method"],
                str(job["slot"]),
                f"{share / 2**30:.1f} GiB" if share else "-",
                job["stage"],
                step,
            ]
        )
    show_table(
        [
            Column("REQUEST"),
            Column("METHOD"),
            Column("SLOT"),
            Column("SHARE", right=True),
            Column("STAGE"),
            Column("STEP", right=True),
        ],
        rows,
    )


def doctor(
    config: ConfigOption = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON array, an object a check: "
            + ", ".join(CHECK_FIELDS)
            + " (ok: true, false, or null where there was nothing to check). The exit code is the same.",
        ),
    ] = False,
) -> None:
    """Check this host before it takes work: Kafka, the topics, who may write the events topic, the Hub token, GPUs,
    disk, a running daemon; exit 1 on a failure."""
    from daemon.cli.checks.doctor import examine
    from daemon.cli.listing import show_json

    settings = read_settings(config)
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # the kafka check says what aiokafka would log
    found = asyncio.run(examine(settings))
    if as_json:
        show_json([{name: getattr(check, name) for name in CHECK_FIELDS} for check in found])
    else:
        for check in found:
            typer.echo(check.line())
    raise typer.Exit(1 if any(check.ok is False for check in found) else 0)


def keys(
    folder: Annotated[
        Path, typer.Argument(help="Where event-signing-key.pem (owner-only) and event-verify-key.pub go.")
    ],
    team: Annotated[
        str | None,
        typer.Option("--team", help="Make TEAM's producer key pair instead: TEAM-producer-key.pem and .pub."),
    ] = None,
) -> None:
    """Make a key pair for signed events: the private key for each host's event_signing_key_file, the public key for
    readers' event_verify_keys; with --team, a team's: the private key for its producers' producer_key_file, the public
    key for teams.TEAM.producer_keys."""
    from daemon.cli.keys import PRIVATE_NAME, PUBLIC_NAME, make_key_pair, team_names
    from daemon.errors import UsageError
    from schemas.request_base import QUEUE_NAME_PATTERN

    if team is not None and not re.fullmatch(QUEUE_NAME_PATTERN, team):
        typer.echo(f"adapterd: --team: {team!r} is not a team name ({QUEUE_NAME_PATTERN})", err=True)
        raise typer.Exit(2)
    try:
        key_id, public = make_key_pair(folder, team)
    except UsageError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    if team is not None:
        private_name, public_name = team_names(team)
        typer.echo(
            f"key {key_id}: private key {folder / private_name} (its producers' producer_key_file), "
            f"public key {folder / public_name}"
        )
        typer.echo(f'[teams.{team}]\nproducer_keys = ["{public}"]')
        return
    typer.echo(
        f"key {key_id}: private key {folder / PRIVATE_NAME} (event_signing_key_file), public key {folder / PUBLIC_NAME}"
    )
    typer.echo(f'event_verify_keys = ["{public}"]')


def topics(
    config: ConfigOption = None,
    partitions: Annotated[
        int | None,
        typer.Option(
            help="Partitions of each topic; at least the fleet's GPU slots. Default: topic_partitions, else 1."
        ),
    ] = None,
    replication_factor: Annotated[
        int, typer.Option(help="Replicas of each partition (3 on a production cluster).")
    ] = 1,
    grow: Annotated[
        bool,
        typer.Option(
            "--grow",
            help=(
                "Add partitions to a topic that has fewer than asked. A key may then map to another partition: per-key "
                "order holds only for records written after growth."
            ),
        ),
    ] = False,
) -> None:
    """Create every topic the settings name (requests, events, DLQ, control; with classes their queues and the claims
    topic) where missing; say a topic with fewer partitions than asked, and grow it with --grow; exit 1 on a refused or
    short topic."""
    from daemon.cli.checks.topics import report
    from daemon.kafka.admin.topics import make_topics

    settings = read_settings(config)
    count = partitions if partitions is not None else settings.topic_partitions or 1
    made = with_kafka(
        settings, make_topics(settings, partitions=count, replication_factor=replication_factor, grow=grow)
    )
    lines, failed = report(made)
    for line in lines:
        typer.echo(line, err=line.startswith("adapterd:"))
    raise typer.Exit(1 if failed else 0)
