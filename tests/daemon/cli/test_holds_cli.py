"""`adapterd hold`, `release`, `pause`, `resume` (daemon/cli/holds.py): what each says of the request from its events
and whether it sends, the table's `held` state they lead to, and an id that is not one as a usage error."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.cli.holds import plan
from daemon.cli.jobs import fold
from daemon.table.entry import TableEntry
from schemas import Hold, Pause, Release, Resume, parse_event
from tests.helpers import event_document


def folded(*kinds: str) -> dict[str, TableEntry]:
    return fold(
        parse_event(json.dumps(event_document(kind, request_id="x", host="vm", attempt=1)).encode()) for kind in kinds
    )


@pytest.mark.parametrize(
    ("message", "events", "sends", "says"),
    [
        (Pause(request_id="x"), ["accepted", "started", "progress"], True, "x: running on vm; the pause is sent"),
        (Hold(request_id="x"), ["accepted"], True, "x: queued on vm; the hold is sent"),
        (Resume(request_id="x"), ["accepted", "started", "paused"], True, "x: held on vm; the resume is sent"),
        (Release(request_id="x"), ["held"], True, "x: held on vm; the release is sent"),
        (Hold(request_id="x"), [], True, "x: never seen (no host published an event of it); the hold is sent"),
        (Pause(request_id="x"), ["accepted", "started", "succeeded"], False, "x: already succeeded on vm; nothing"),
    ],
)
def test_each_says_what_it_knows_of_the_request_and_what_will_happen(
    message: Hold | Release | Pause | Resume, events: list[str], sends: bool, says: str
) -> None:
    decided = plan(message, folded(*events).get("x"), "adapterd.control")
    assert decided.send is sends and decided.said.startswith(says), decided.said


def test_a_paused_or_held_request_is_held_in_the_table_and_queued_again_once_released() -> None:
    jobs = folded("accepted", "started", "paused")
    assert jobs["x"].state == "held" and jobs["x"].detail.startswith("paused at step 120")
    assert folded("held")["x"].state == "held"
    assert folded("accepted", "started", "paused", "released")["x"].state == "queued"


def test_an_id_that_is_not_one_is_a_usage_error(tmp_path: Path) -> None:
    config = tmp_path / "host.toml"
    config.write_text('bootstrap_servers = "127.0.0.1:9"\n')
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "pause", "not an id", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "adapterd: not a request id: 'not an id'" in result.stderr, result.stderr
