"""The listing verbs' output without a broker (daemon/cli/listing.py, issue 63): tables whose columns are as wide as
their content, so a request id of 100 characters (or the demo's second id, 30: today's 28-character column broke on
it) leaves every other column where the header puts it, in a pipe and on a terminal; and `--json`, one JSON document
whose fields are the ones deploy/README.md names. The real broker: test_jobs_cli.py and test_queue_cli.py."""

from __future__ import annotations

import io
import json
import re
import sys
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from daemon.cli import jobs
from daemon.cli.app import app
from daemon.cli.checks.doctor import Check
from daemon.cli.listing import (
    CHECK_FIELDS,
    JOB_FIELDS,
    METHOD_FIELDS,
    USAGE_FIELDS,
    WAITING_FIELDS,
    Column,
    plain,
    show_json,
    show_table,
)
from daemon.cli.places import COLUMNS as QUEUE_COLUMNS
from daemon.cli.places import Placed
from daemon.cli.waiting import SentCancel, WaitingRequest
from daemon.table.entry import EntryHead
from schemas.methods import METHODS
from tests.helpers import status_config

runner = CliRunner()
ROOT = Path(__file__).parents[3]
NOW = datetime(2026, 12, 5, 18, 0, tzinfo=UTC)
LONG = "sweep-lr-grid-3-" + "x" * 84  # 100 characters
IDS = ["r1", "demo-sft-20261205-180000", "demo-sft-20261205-180000-again", LONG]


def head(request_id: str, minutes_ago: int, state: str = "succeeded", method: str | None = "sft") -> EntryHead:
    return EntryHead(
        request_id=request_id,
        state=state,  # type: ignore[arg-type]
        method=method,
        host="gpu-a",
        attempt=2,
        since=NOW - timedelta(minutes=minutes_ago + 5),
        last=NOW - timedelta(minutes=minutes_ago),
        latest=state,
        detail="published main: my-org/x@main [duplicate]",
        events=7,
    )


HEADS = [head(request_id, 40 - 10 * number) for number, request_id in enumerate(IDS)]
HEADS[1] = head(IDS[1], 30, state="running", method=None)


def assert_in_columns(text: str, columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> None:
    """Each row's cells stand in their columns: a left-aligned cell starts where its header does, a right-aligned
    one ends where its header ends; every row on a line of its own (a rule under the header is passed over)."""
    lines = [line for line in text.splitlines() if line.strip() and set(line.strip()) != {"─"}]
    header, *body = lines
    assert len(body) == len(rows), text
    for line, cells in zip(body, rows, strict=True):
        for column, cell in zip(columns, cells, strict=True):
            start = header.index(column.header)
            if column.right:
                end = start + len(column.header)
                assert line[end - len(cell) : end] == cell and line[end - len(cell) - 1] == " ", (column, line)
            else:
                assert line[start : start + len(cell)] == cell, (column, line)
                assert start == 0 or line[start - 1] == " ", (column, line)


def test_a_100_character_id_leaves_every_column_of_jobs_in_its_place_in_a_pipe() -> None:
    rows = [jobs.row(job, NOW) for job in HEADS]
    text = plain(jobs.COLUMNS, rows)
    assert_in_columns(text, jobs.COLUMNS, rows)
    lines = text.splitlines()
    assert len(lines) == 1 + len(IDS) and lines[-1].startswith(LONG + "  succeeded  sft")  # whole, on one line
    assert [line.split()[:2] for line in lines[1:]] == [[each.request_id, each.state] for each in HEADS]
    assert all(line == line.rstrip() for line in lines) and not re.search("[─│┃━]", text)  # no box, no trailing spaces
    assert rows[1][2] == "-"  # no method yet


def test_the_waiting_requests_table_fits_a_100_character_id() -> None:
    placed = [placed_request(LONG, place=1), placed_request("b1", place=2, eta_s=5400.0)]
    rows = [each.row() for each in placed]
    assert_in_columns(plain(QUEUE_COLUMNS, rows), QUEUE_COLUMNS, rows)


def test_on_a_terminal_rich_draws_the_table_its_id_whole_and_its_columns_in_place() -> None:
    rows = [jobs.row(job, NOW) for job in HEADS]
    wide = io.StringIO()
    show_table(jobs.COLUMNS, rows, Console(file=wide, width=220, color_system=None))
    text = wide.getvalue()
    assert "─" * 20 in text.splitlines()[1]  # the rule under the header: rich drew it
    assert_in_columns(text, jobs.COLUMNS, rows)
    assert "[duplicate]" in text  # shown as it is, not read as markup
    # Narrower than the table's longest row: the last column wraps, the id and the other columns stay whole.
    narrow = io.StringIO()
    show_table(jobs.COLUMNS, rows, Console(file=narrow, width=165, color_system=None))
    lines = narrow.getvalue().splitlines()
    assert len(lines) > 2 + len(rows) and any(line.startswith(LONG + " ") for line in lines)
    assert all(len(line.rstrip()) <= 165 for line in lines)
    # Narrower than the id and the columns beside it: plain columns, which the terminal folds, nothing cropped.
    cramped = io.StringIO()
    show_table(jobs.COLUMNS, rows, Console(file=cramped, width=80, color_system=None))
    assert cramped.getvalue() == plain(jobs.COLUMNS, rows) + "\n"


def test_show_table_is_plain_where_stdout_is_no_terminal_and_rich_where_it_is_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = [jobs.row(job, NOW) for job in HEADS]
    show_table(jobs.COLUMNS, rows)
    assert capsys.readouterr().out == plain(jobs.COLUMNS, rows) + "\n"

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setenv("COLUMNS", "250")
    show_table(jobs.COLUMNS, rows)
    assert "─" * 20 in terminal.getvalue() and LONG in terminal.getvalue()


def test_jobs_json_is_an_array_of_each_requests_fields_times_in_iso_8601(capsys: pytest.CaptureFixture[str]) -> None:
    show_json([jobs.document(job) for job in HEADS])
    said = json.loads(capsys.readouterr().out)
    assert [list(each) for each in said] == [list(JOB_FIELDS)] * len(HEADS)
    assert [each["request_id"] for each in said] == IDS
    first = said[0]
    assert first["state"] == "succeeded" and first["method"] == "sft" and said[1]["method"] is None
    assert first["attempt"] == 2 and first["events"] == 7  # numbers, not text
    assert first["last"].endswith("Z") and datetime.fromisoformat(first["last"]) == HEADS[0].last
    assert datetime.fromisoformat(first["since"]) == HEADS[0].since


def placed_request(request_id: str, place: int | None, eta_s: float | None = None, **fields: Any) -> Placed:
    waiting = WaitingRequest(
        request_id,
        "batch",
        "search",
        NOW - timedelta(minutes=9),
        "sft",
        "tiny-gpt2",
        1,
        {"sweep": "lr-grid-3"},
        "unread",
        "requests[0]@4",
        at=("requests", 0, 4),
        **fields,
    )
    return Placed(waiting, place, eta_s, 2)


def test_a_waiting_requests_json_names_its_place_eta_and_where_it_waits(capsys: pytest.CaptureFixture[str]) -> None:
    cancelled = placed_request("b2", None, cancel=SentCancel(NOW, "sweep withdrawn"))
    show_json([placed_request("b1", 1, 90.0).document(), cancelled.document()])
    first, second = json.loads(capsys.readouterr().out)
    assert list(first) == list(WAITING_FIELDS)
    assert (first["request_id"], first["state"], first["stage"], first["place"], first["of"], first["eta_s"]) == (
        "b1",
        "queued",
        "unread",
        1,
        2,
        90.0,
    )
    assert first["priority_class"] == "batch" and first["where"] == "requests[0]@4" and first["gpus"] == 1
    assert first["metadata"] == {"sweep": "lr-grid-3"} and first["cancel"] is None
    assert datetime.fromisoformat(first["arrived"]) == NOW - timedelta(minutes=9)
    assert second["place"] is None and second["cancel"] == {"sent": "2026-12-05T18:00:00Z", "reason": "sweep withdrawn"}


@pytest.fixture
def daemon_status(tmp_path: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """A daemon's /status (Service.status's shape) served where a config file's metrics_address says."""
    document: dict[str, Any] = {
        "host": "gpu-a",
        "group_id": "adapterd",
        "gpus": [0, 1],
        "slots": {"total": 2, "busy": 2, "free": []},
        "packing": None,
        "jobs": [
            {"request_id": "r1", "method": "sft", "slot": "0", "stage": "train", "step": 7, "total_steps": 50},
            {"request_id": LONG, "method": "grpo", "slot": "1", "stage": "preflight", "memory_share_bytes": 2**31},
        ],
        "children": {"mode": "spawn"},
    }

    with status_config(document, tmp_path) as config:
        yield config, document


def test_status_lists_the_jobs_in_a_table_that_fits_a_100_character_id(daemon_status: tuple[Path, Any]) -> None:
    config, _ = daemon_status
    result = runner.invoke(app, ["status", "-c", str(config)])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "host gpu-a, group adapterd: 2 of 2 slot(s) busy"
    columns = [Column("REQUEST"), Column("METHOD"), Column("SLOT"), Column("SHARE", True), Column("STAGE")]
    columns.append(Column("STEP", True))
    assert_in_columns(
        "\n".join(lines[1:]),
        columns,
        [["r1", "sft", "0", "-", "train", "7/50"], [LONG, "grpo", "1", "2.0 GiB", "preflight", "-"]],
    )


def test_status_json_is_the_daemons_document(daemon_status: tuple[Path, Any]) -> None:
    config, document = daemon_status
    result = runner.invoke(app, ["status", "-c", str(config), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout) == document


def test_methods_json_names_each_method_and_whether_this_host_can_run_it() -> None:
    result = runner.invoke(app, ["methods", "--json"])
    assert result.exit_code == 0
    said = json.loads(result.stdout)
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", said["trl"])
    assert [each["method"] for each in said["methods"]] == list(METHODS)
    assert all(list(each) == list(METHOD_FIELDS) for each in said["methods"])
    by_name = {each["method"]: each for each in said["methods"]}
    assert by_name["sft"] == {
        "method": "sft",
        "trainer": "trl.SFTTrainer",
        "status": "stable",
        "available": True,
        "reason": None,
    }
    assert by_name["ppo"]["available"] is False and "needs trl>=1.10,<1.13" in by_name["ppo"]["reason"]


def test_doctor_json_is_its_checks_and_its_exit_code_the_same(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from daemon.cli.checks import doctor

    found = [Check("kafka", True, "3 brokers"), Check("gpus", None, "no GPU"), Check("disk", False, "1 GiB free")]

    async def examine(settings: Any) -> list[Check]:
        return found

    monkeypatch.setattr(doctor, "examine", examine)
    config = tmp_path / "host.toml"
    config.write_text("")
    result = runner.invoke(app, ["doctor", "--json", "-c", str(config)])
    assert result.exit_code == 1  # a check failed, as without --json
    assert json.loads(result.stdout) == [
        {"name": "kafka", "ok": True, "warn": False, "detail": "3 brokers"},
        {"name": "gpus", "ok": None, "warn": False, "detail": "no GPU"},
        {"name": "disk", "ok": False, "warn": False, "detail": "1 GiB free"},
    ]
    assert all(list(each) == list(CHECK_FIELDS) for each in json.loads(result.stdout))


def test_the_operator_docs_name_every_json_field() -> None:
    """deploy/README.md's "Machine-readable output" lists each document's fields as the code gives them."""
    text = (ROOT / "deploy" / "README.md").read_text()
    section = text[text.index("### Machine-readable output") :]
    section = section[: section.index("\n#", 1)]
    for fields in (JOB_FIELDS, WAITING_FIELDS, METHOD_FIELDS, CHECK_FIELDS, USAGE_FIELDS):
        assert ", ".join(f"`{name}`" for name in fields) in " ".join(section.split()), fields
