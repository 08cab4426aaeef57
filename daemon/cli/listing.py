"""How a listing verb (`adapterd jobs`, `get`, `status`, `methods`, `doctor`, `usage`) prints what it lists: a table
whose columns are as wide as their content (`show_table`), or, with `--json`, one JSON document (`show_json`). What a
verb says beside its listing (what it did not take, a topic that is missing) goes to stderr either way, so stdout holds
the listing alone and, with `--json`, parses as JSON.

A table goes to a terminal as rich's Table: each column as wide as its widest cell, the id's never cut; only the last
column (free text: a detail, where a request waits) wraps at the terminal's width. Anywhere else (a pipe, a file) it
is plain text, one line a row: each column as wide as its widest cell and two spaces from the next, nothing wrapped,
cut or boxed. Why not rich's Table there too: the scripts that read a listing split its lines on whitespace, and want
neither box characters nor a row folded onto two lines; and rich lays out a row in about 0.35 ms (8 s for the 22,605
requests of a fleet's week, `adapterd jobs` in issue 59), where the plain columns take 0.02 s for all of them. Why
not tabs: on a screen or in `less` an id longer than a tab stop shifts every column after it, which is what this
module is for. A terminal gets the plain columns too past `TERMINAL_ROWS` rows (a listing that long is paged or
searched, not read as a box), and where the table cannot fit its width without cutting a column.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import typer
from pydantic_core import to_json

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

# The fields of each verb's `--json` document, its contract with the scripts that read it (deploy/README.md,
# "Machine-readable output"): named as the code's own fields are, snake_case; times ISO 8601, numbers numbers.
# `adapterd jobs`: a request's entry in the table of requests (daemon/table/entry.py EntryHead), without the table's
# bookkeeping (where in the events topic its latest event was folded from: `partition`, `offset`, `ids`).
JOB_FIELDS = ("request_id", "state", "method", "host", "attempt", "since", "last", "latest", "detail", "events")
# `adapterd jobs --state queued`: a waiting request (daemon/cli/places.py `Placed`, daemon/cli/waiting.py
# `WaitingRequest`); `state` is always "queued", the state `--state` names it by; `stage` how it waits (the table's
# WAITING); `of` how many are placed in its queue; `cancel` its cancel pending, with `sent` and `reason`, or null.
WAITING_FIELDS = (
    "request_id",
    "state",
    "priority_class",
    "team",
    "place",
    "of",
    "eta_s",
    "stage",
    "method",
    "model",
    "gpus",
    "where",
    "host",
    "arrived",
    "detail",
    "metadata",
    "cancel",
)
# `adapterd methods`: a training method (schemas/methods.py); `status` stable or experimental, `available` whether this
# host's TRL can run it, `reason` why not (null when it can).
METHOD_FIELDS = ("method", "trainer", "status", "available", "reason")
# `adapterd doctor`: a check (daemon/cli/checks/doctor.py `Check`); `ok` null where there was nothing to check.
CHECK_FIELDS = ("name", "ok", "warn", "detail")
# `adapterd usage` (daemon/cli/usage.py `rows_of`): a row of the report; `team` and `priority_class` only where `--by`
# groups by them, `from` and `to` the period.
USAGE_FIELDS = ("team", "priority_class", "gpu_hours", "jobs", "runs", "from", "to")

TERMINAL_ROWS = 1000  # above it, rich's layout (0.35 ms a row) costs more than a box is worth: plain columns
GAP = "  "  # between two columns of the plain text
UNBOUNDED = 1 << 20  # a width no table reaches: to measure how wide a table needs to be


@dataclass(frozen=True)
class Column:
    """A table's column: its header, and whether its cells are numbers (right-aligned, as numbers are read)."""

    header: str
    right: bool = False


def plain(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> str:
    """The table as plain text: its header line, then a line a row; each column as wide as its widest cell, the last
    one unpadded, no line ending in spaces."""
    widths = [max([len(column.header), *(len(row[index]) for row in rows)]) for index, column in enumerate(columns)]
    last = len(columns) - 1

    def line(cells: Sequence[str]) -> str:
        return GAP.join(
            cell.rjust(width) if column.right else cell if index == last else cell.ljust(width)
            for index, (column, cell, width) in enumerate(zip(columns, cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line([column.header for column in columns]), *(line(row) for row in rows)])


def terminal_table(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> Table:
    """The table as rich draws it on a terminal: a rule under the header, no column narrower than its widest cell
    but the last, which wraps at the terminal's width."""
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, header_style="bold")
    last = len(columns) - 1
    for index, column in enumerate(columns):
        widest = max([len(column.header), *(len(row[index]) for row in rows)])
        table.add_column(
            column.header,
            justify="right" if column.right else "left",
            no_wrap=index != last,
            min_width=None if index == last else widest,
        )
    for row in rows:
        # As Text: a cell is shown as it is, never read as rich's markup (a detail's "[duplicate]", an id's brackets).
        table.add_row(*(Text(cell) for cell in row))
    return table


def show_table(columns: Sequence[Column], rows: Sequence[Sequence[str]], console: Console | None = None) -> None:
    """Print the table to stdout: on a terminal as rich's Table (`console`: the terminal's, by default stdout's where
    it is one); as plain columns anywhere else, past `TERMINAL_ROWS` rows, or where the table's narrowest is wider
    than the terminal: rich would crop its lines at the edge, and the terminal folds a plain line, losing nothing."""
    if console is None and sys.stdout.isatty():
        from rich.console import Console

        console = Console(highlight=False, emoji=False)
    if console is not None and len(rows) <= TERMINAL_ROWS:
        table = terminal_table(columns, rows)
        # Measured unbounded: within the terminal's width rich reports at most that width, whatever the table needs.
        if console.measure(table, options=console.options.update_width(UNBOUNDED)).minimum <= console.width:
            console.print(table)
            return
    text = plain(columns, rows)
    if console is not None:
        console.file.write(text + "\n")
        return
    # One write: an echo a row (each asking whether the output is a terminal) was a tenth of 22,605 rows' time.
    typer.echo(text)


def show_json(document: Any) -> None:
    """Print `document` to stdout as one JSON document, indented: times as ISO 8601 (UTC with a Z, as the events' own),
    numbers as numbers (a NaN or an infinity as null, which JSON has no word for), pydantic models and dataclasses as
    objects of their fields. pydantic's serializer: the standard library's, indented, took 0.3 s for 22,605 requests,
    this 0.04."""
    typer.echo(to_json(document, indent=2, inf_nan_mode="null").decode())
