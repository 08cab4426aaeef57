"""The commands that show what adapterd offers: `methods`, `schema`, and `demo`, which runs one job end to end."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from daemon.cli.listing import METHOD_FIELDS


def methods(
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print one JSON object: trl (its version) and methods, an object a method: "
            + ", ".join(METHOD_FIELDS)
            + " (reason: why this host cannot run it, or null).",
        ),
    ] = False,
) -> None:
    """List the training methods, the TRL trainer of each, and whether this host's TRL can run it."""
    from daemon.admission.capabilities import trl_version, unsupported_reason
    from daemon.cli.listing import Column, show_json, show_table
    from schemas.methods import METHODS

    listed = [(name, method, unsupported_reason(name)) for name, method in METHODS.items()]
    if as_json:
        show_json(
            {
                "trl": trl_version(),
                "methods": [
                    dict(zip(METHOD_FIELDS, (name, method.trainer, method.status, reason is None, reason), strict=True))
                    for name, method, reason in listed
                ],
            }
        )
        return
    typer.echo(f"trl {trl_version()}")
    show_table(
        [Column("METHOD"), Column("TRAINER"), Column("STATUS"), Column("HERE")],
        [
            [name, method.trainer, method.status, "available" if reason is None else f"unavailable: {reason}"]
            for name, method, reason in listed
        ],
    )


def schema(
    which: Annotated[
        Literal["request", "event", "control"] | None, typer.Argument(help="One schema; all three when left out.")
    ] = None,
) -> None:
    """Print the JSON Schemas of requests, events and control messages (schemas/json/)."""
    from schemas.generated import json_schemas

    schemas = json_schemas()
    typer.echo(json.dumps(schemas if which is None else schemas[f"{which}.schema.json"], indent=2))


def demo(
    work_dir: Annotated[Path, typer.Option(help="Where the broker, the tiny model and the adapter go.")] = Path(
        "adapterd-demo"
    ),
    method: Annotated[
        str,
        typer.Option(
            help="The training method to show (see `adapterd methods`), or sft-vision, dpo-vision, grpo-vision, "
            "grpo-math (GRPO on sums, TRL's accuracy reward)."
        ),
    ] = "sft",
    gate: Annotated[
        bool,
        typer.Option(
            help="Two SFT requests judged before publishing: one passes its gate; one, on the tiny "
            "model poisoned with NaN, fails it."
        ),
    ] = False,
    keep: Annotated[
        bool,
        typer.Option(
            help="Leave the broker and the daemon running afterwards, to try submit, jobs, get, events and cancel "
            "against them; Ctrl-C stops both."
        ),
    ] = False,
) -> None:
    """Run the main job on built-in defaults: local broker, tiny model, one request (SFT
    unless --method), local output."""
    from daemon.cli.demo import main

    sys.exit(main(work_dir, method, gate, keep))
