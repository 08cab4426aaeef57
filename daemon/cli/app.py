"""The `adapterd` command line: the typer app and the registration of its commands, which live in
daemon/cli/commands/ a group a module (requests in; the fleet read; this host; what adapterd offers).

Exit codes, the same for every command: 0 done; 1 the request, the job or a service failed what was
asked (an invalid request, a job that did not succeed, a broker or daemon that does not answer);
2 a usage or configuration error (an unknown option, a file that cannot be read, bad settings).
"""

from __future__ import annotations

from importlib.metadata import version as installed_version
from typing import Annotated

import typer

from daemon.cli.commands import fleet, host, reference, requests
from daemon.cli.convert import convert_app

app = typer.Typer(
    no_args_is_help=True,
    help="Run TRL post-training jobs from a Kafka stream. Exit codes: 0 done, 1 failed, "
    "2 usage or configuration error.",
)


def _show_version(shown: bool) -> None:
    if shown:
        typer.echo(f"adapterd {installed_version('adapterd')}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Run TRL post-training jobs from a Kafka stream."""


# In the order `adapterd --help` lists them: the daemon, a request's way in and out, the host, the reference.
for command in (
    host.run,
    requests.validate,
    requests.submit,
    fleet.events,
    fleet.jobs,
    fleet.get,
    fleet.logs,
    fleet.usage,
    requests.cancel,
    requests.hold,
    requests.release,
    requests.pause,
    requests.resume,
    host.status,
    host.doctor,
    host.keys,
    host.topics,
    reference.methods,
    reference.schema,
):
    app.command()(command)
app.add_typer(convert_app, name="convert")
app.command()(reference.demo)


if __name__ == "__main__":
    app()
