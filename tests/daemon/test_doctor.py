"""`adapterd doctor` against a real broker and the local Hub: one line a check, exit 1 when one fails
(an unreachable broker, a missing topic, a token the Hub refuses or one that cannot write where
requests push), exit 0 on a host ready for work."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.settings import Settings
from schemas.signing import EventSigner, new_key_pair, read_private_key
from testbed.client import submit, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import settings_environment

runner = CliRunner()
WHO = {"type": "user", "name": "ops-bot", "orgs": [{"name": "my-org", "roleInOrg": "write"}, {"name": "their-org", "roleInOrg": "read"}],
       "auth": {"accessToken": {"role": "write"}}}


@pytest.fixture
def strict_hub() -> Iterator[HubServer]:
    """A Hub that knows one token (the session's Hub takes any)."""
    hub = HubServer(tokens={"hf_good": WHO}).start()
    yield hub
    hub.stop()


def doctor(settings: Settings, **changes: Any) -> tuple[int, dict[str, str]]:
    result = runner.invoke(app, ["doctor"], env=settings_environment(settings.model_copy(update=changes)))
    lines = {line[5:].split()[0]: line for line in result.output.splitlines() if line[:4] in ("ok  ", "FAIL", "--  ")}
    return result.exit_code, lines


def test_a_host_ready_for_work(settings: Settings, strict_hub: HubServer) -> None:
    code, lines = doctor(settings, hub_endpoint=strict_hub.endpoint, hub_token=SecretStr("hf_good"), allowed_output_namespaces=["my-org", "ops-bot"])
    assert code == 0, lines
    assert lines["kafka"].startswith("ok") and lines["topics"].startswith("ok") and f"{settings.dlq_topic} (1 partitions)" in lines["topics"]
    assert lines["hub"] == "ok   hub     token of ops-bot (write); pushes to my-org, ops-bot"
    assert set(lines) == {"kafka", "topics", "events", "hub", "gpus", "disk", "daemon"}
    assert lines["events"].startswith("--") and "warning: no event keys" in lines["events"]  # a warning, not a failure


def test_a_host_that_signs_its_events(settings: Settings, tmp_path: Path) -> None:
    pem, public = new_key_pair()
    (tmp_path / "key.pem").write_bytes(pem)
    code, lines = doctor(settings, event_signing_key_file=tmp_path / "key.pem", event_verify_keys=[new_key_pair()[1]])
    assert lines["events"] == f"ok   events  signs its events with key {EventSigner(read_private_key(pem)).key_id}; trusts 2 key(s) on the events it reads"
    _, reader = doctor(settings, event_verify_keys=[public])  # an operator's machine, or a host not yet given the key
    assert reader["events"].startswith("--") and "events go out unsigned, which readers holding keys ignore; trusts 1 key(s)" in reader["events"]


def test_a_token_the_hub_refuses(settings: Settings, strict_hub: HubServer) -> None:
    code, lines = doctor(settings, hub_endpoint=strict_hub.endpoint, hub_token=SecretStr("hf_wrong"))
    assert code == 1 and lines["hub"].startswith("FAIL") and "refuses the token (HTTP 401)" in lines["hub"]


def test_a_token_that_cannot_write_where_requests_push(settings: Settings, strict_hub: HubServer) -> None:
    code, lines = doctor(settings, hub_endpoint=strict_hub.endpoint, hub_token=SecretStr("hf_good"), allowed_output_namespaces=["my-org", "their-org", "else"])
    assert code == 1 and "ops-bot's, who cannot write to their-org, else" in lines["hub"]


def test_an_unreachable_broker(settings: Settings) -> None:
    code, lines = doctor(settings, bootstrap_servers="127.0.0.1:9")  # the discard port: nothing listens
    assert code == 1 and lines["kafka"].startswith("FAIL") and "no broker answers at 127.0.0.1:9" in lines["kafka"]
    assert lines["topics"].startswith("--")


def test_a_missing_topic(settings: Settings) -> None:
    missing = f"{settings.dlq_topic}-never-created"
    code, lines = doctor(settings, dlq_topic=missing)
    assert code == 1 and lines["topics"] == f"FAIL topics  missing: {missing}; create them (adapterd topics --partitions N)"


async def test_a_running_daemon_and_its_fork_server(shared_settings: Settings, shared_daemon: Any) -> None:
    await submit(shared_settings, {"request_id": "doctor-turn", "schema_version": 1})  # rejected: the daemon's loop turns
    await terminal_events(shared_settings, {"doctor-turn"})
    result = subprocess.run([sys.executable, "-m", "daemon.cli.app", "doctor"], env=settings_environment(shared_settings),
                            capture_output=True, text=True, timeout=120)
    [line] = [line for line in result.stdout.splitlines() if line[5:].startswith("daemon")]
    assert line.startswith("ok   daemon  running: healthy True"), result.stdout
    assert "children start by fork, fork server " in line, line
