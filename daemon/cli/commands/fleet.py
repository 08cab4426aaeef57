"""The commands that read the fleet from its topics and its hosts: `events`, `jobs`, `get`, `logs` and `usage`."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer

from daemon.cli.listing import JOB_FIELDS, WAITING_FIELDS
from daemon.cli.options import ConfigOption, read_settings, with_kafka
from daemon.kafka.event_reader import EventStream


def events(
    config: ConfigOption = None,
    request_id: Annotated[str | None, typer.Option("--request-id", help="Only this request's events.")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events until interrupted.")] = False,
) -> None:
    """Print lifecycle events as JSON lines: those already published, then new ones with --follow."""
    settings = read_settings(config)

    async def read() -> None:
        async with EventStream(settings) as stream:
            async for event in stream.events(request_id, until_terminal=False, follow=follow):
                typer.echo(event.model_dump_json())

    try:
        with_kafka(settings, read())
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a --follow ends: the reader is closed, and that is success


def jobs(
    config: ConfigOption = None,
    state: Annotated[
        list[str] | None,
        typer.Option(
            "--state",
            help=(
                "Only requests in this state (queued, held, running, succeeded, failed, cancelled, rejected); "
                "repeatable."
            ),
        ),
    ] = None,
    method: Annotated[str | None, typer.Option(help="Only requests of this method.")] = None,
    host: Annotated[str | None, typer.Option(help="Only requests whose latest event came from this host.")] = None,
    since: Annotated[
        str | None, typer.Option(help="Only requests with an event in this past age: 30m, 2h, 7d.")
    ] = None,
    slots: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=(
                "The fleet's slots, for the ETAs of --state queued with priority classes; default: the hosts "
                "that started a job in the last 24 hours, each counted with the slots its latest `accepted` "
                "event said (one where it said none). Without classes each partition is its own queue, and "
                "its ETAs follow its running job."
            ),
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help=(
                "Print one JSON array, an object a request, oldest latest event first: "
                + ", ".join(JOB_FIELDS)
                + " (times ISO 8601); with --state queued, each waiting request's: "
                + ", ".join(WAITING_FIELDS)
                + ". What is said beside it stays on stderr."
            ),
        ),
    ] = False,
) -> None:
    """Every request's latest state across the fleet, from the table of requests and the events past it; newest last.
    --state queued lists every waiting request, read from the queues themselves, in the fleet's order: its class,
    team, place, ETA and where it waits; those with a cancel pending are left out, counted in no one's place, and named
    on stderr."""
    from datetime import UTC, datetime

    from daemon.cli.jobs import COLUMNS, STATES, age, document, row, say
    from daemon.cli.listing import show_json, show_table
    from daemon.table.reader import read_table

    settings = read_settings(config)
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
    queued = bool(state and "queued" in state)  # the places read the entries' events (their usage): read whole
    table = with_kafka(settings, read_table(settings, heads=not queued))
    say(table)
    others = [each for each in state or [] if each != "queued"]
    listed = [
        job
        for job in table.listed()
        if (not state or job.state in others)
        and (method is None or job.method == method)
        and (host is None or job.host == host)
        and (within is None or now - job.last <= within)
    ]
    documents: list[dict[str, Any]] = []  # with --json: the requests of both tables, in one array
    if not state or others:
        jobs_in_order = sorted(listed, key=lambda job: (job.last, job.since, job.request_id))
        if as_json:
            documents += [document(job) for job in jobs_in_order]
        else:
            show_table(COLUMNS, [row(job, now) for job in jobs_in_order])
    if queued:
        from daemon.cli.places import COLUMNS as QUEUE_COLUMNS
        from daemon.cli.places import placed_backlog, queue_table

        backlog, placed = with_kafka(settings, placed_backlog(settings, slots, now, table))
        for topic in backlog.missing:
            typer.echo(f"adapterd: topic {topic} does not exist; nothing waits there", err=True)
        waiting, pending = queue_table(placed, method, host, within, now)
        if as_json:
            documents += [each.document() for each in waiting]
        else:
            if others:
                typer.echo()  # the waiting requests are a table of their own, with their own columns
            show_table(QUEUE_COLUMNS, [each.row() for each in waiting])
        if pending is not None:
            typer.echo(f"adapterd: {pending}", err=True)  # on stderr, as the missing topics: the table alone on stdout
    if as_json:
        show_json(documents)


def get(
    request_id: str,
    config: ConfigOption = None,
    slots: Annotated[
        int | None, typer.Option(min=1, help="The fleet's slots, for a waiting request's ETA (as in `adapterd jobs`).")
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help=(
                "Print one JSON object: the request's "
                + ", ".join(JOB_FIELDS)
                + " as `jobs --json` (state queued and the rest null where no host has said a word of it yet); "
                "`history`, its events as `adapterd events` "
                "prints them, the latest progress only; `waiting`, where it waits as `jobs --state queued --json` "
                "gives it with `worked_out_at`, or null."
            ),
        ),
    ] = False,
) -> None:
    """One request's history, event by event, and where it stands; a waiting one's place and ETA, worked out now, and
    where it waits, or that its cancel is pending; exit 1 when it has no events and waits nowhere. Its state is its
    entry in the table of requests with its later events folded on; its history, its events since its entry's start
    (or all of them where it has no entry): one partition of each topic, its key's."""
    from datetime import UTC, datetime

    from daemon.cli.console import describe
    from daemon.cli.jobs import document, say
    from daemon.cli.listing import show_json
    from daemon.cli.places import waiting_placed, where_it_waits
    from daemon.table.reader import read_request

    settings = read_settings(config)
    read = with_kafka(settings, read_request(settings, request_id))
    say(read)
    job = read.entries.get(request_id)
    waits = None  # where it waits, when its events do not say it runs or ended: read from the queues themselves
    now = datetime.now(UTC)
    if job is None or job.state in ("queued", "held"):
        waits = with_kafka(settings, waiting_placed(settings, request_id, slots, now))
    if job is None and waits is None:
        typer.echo(
            f"adapterd: no events for {request_id} in {settings.events_topic}, and it waits in none of the queues",
            err=True,
        )
        raise typer.Exit(1)
    last_progress = max((index for index, event in enumerate(read.events) if event.type == "progress"), default=None)
    # One line a step would bury the rest: the latest is shown.
    events = [event for index, event in enumerate(read.events) if event.type != "progress" or index == last_progress]
    # A `queued` event's place and ETA were its host's when it published it: with the fresh ones below, they are left
    # out.
    detail = "" if job is None or (waits is not None and job.latest == "queued") else job.detail
    if as_json:
        said = (
            {**document(job), "detail": detail}
            if job is not None
            else {**dict.fromkeys(JOB_FIELDS), "request_id": request_id, "state": "queued"}
        )
        show_json(
            {
                **said,
                "history": [event.model_dump(mode="json") for event in events],
                "waiting": None if waits is None else {**waits.document(), "worked_out_at": now},
            }
        )
        return
    for event in events:
        typer.echo(describe(event) + (f" (step {event.step}/{event.total_steps})" if event.type == "progress" else ""))
    if job is not None:
        typer.echo(
            f"{request_id}: {job.state}, method {job.method or '-'}, attempt {job.attempt}, on {job.host}"
            + (f"; {detail}" if detail else "")
        )
    if waits is not None:
        typer.echo(where_it_waits(waits, now))


def logs(
    request_id: str,
    config: ConfigOption = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing the log as it grows, until the request ends.")
    ] = False,
) -> None:
    """The trainer's log of a request, from whichever host runs or ran it (its endpoint,
    with the fleet's logs_token)."""
    from daemon.cli.logs import LogsError, show_log

    settings = read_settings(config)

    def write(data: bytes) -> None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()

    try:
        with_kafka(settings, show_log(settings, request_id, follow, write))
    except LogsError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(1) from exc


def usage(
    config: ConfigOption = None,
    since: Annotated[
        str | None,
        typer.Option(help="The period: this past age up to now (30m, 12h, 30d); 30d when no period is given."),
    ] = None,
    start: Annotated[
        str | None, typer.Option("--from", help="The period's start, ISO-8601 (2026-11-01; UTC unless it says).")
    ] = None,
    end: Annotated[str | None, typer.Option("--to", help="The period's end, ISO-8601; default now.")] = None,
    by: Annotated[str, typer.Option(help="team, class, or team,class: what each line totals.")] = "team,class",
    look_back: Annotated[
        str | None,
        typer.Option(
            help=(
                "How far before the period's start events are read, for the runs that began before it: a run that "
                "began earlier is not seen. Default: max_timeout_s (the longest a job runs) and a day."
            )
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="A JSON array, an object a line of the table.")] = False,
) -> None:
    """GPU-hours, jobs and runs per team and priority class in a period, for chargeback, from the events: a run holds
    the GPUs its `started` event names from then to its end (or, its daemon stopped, to its request's next `accepted`);
    a run straddling the period's edges counts its part inside; one still going counts up to now. CPU jobs are jobs of
    no GPU-hours."""
    from datetime import UTC, datetime

    from daemon.cli import usage as chargeback
    from daemon.cli.listing import show_json, show_table
    from daemon.fleet.policy.chargeback import report

    settings = read_settings(config)
    now = datetime.now(UTC)
    try:
        begins, ends = chargeback.period(since, start, end, now)
        grouped = chargeback.groupings(by)
        before = chargeback.look_back(settings, look_back)
    except ValueError as exc:
        typer.echo(f"adapterd: {exc}", err=True)
        raise typer.Exit(2) from exc
    events = with_kafka(settings, chargeback.read_events(settings, begins - before))
    rows = report(events, begins, ends, now.timestamp(), by=grouped)
    ends = min(ends, now)  # what the figures cover: nothing is counted past now
    if as_json:
        show_json(chargeback.rows_of(rows, grouped, begins, ends))
        return
    # The period beside the listing, on stderr as every listing verb says what is not its rows: stdout is the table.
    typer.echo(f"GPU-hours from {begins.isoformat()} to {ends.isoformat()}", err=True)
    show_table(*chargeback.table_of(rows, grouped))
