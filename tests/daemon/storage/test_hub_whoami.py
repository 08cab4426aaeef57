"""`hub_user` (daemon/hub/whoami.py), the start-up's question of whose the Hub token is, against
testbed's local Hub server through the real huggingface_hub client: the name for a token the Hub
knows; None and `hub.token_unusable`, never an exception, for one it refuses or a Hub that is not there."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr
from structlog.testing import capture_logs

from daemon.hub.whoami import hub_user
from daemon.settings import Settings
from testbed.hub_server import HubServer


@pytest.fixture
def hub_with_tokens() -> Iterator[HubServer]:
    server = HubServer(tokens={"hf_known": {"type": "user", "name": "alice", "orgs": [], "auth": {}}}).start()
    yield server
    server.stop()


def settings(tmp_path: Path, endpoint: str, token: str) -> Settings:
    return Settings(work_dir=tmp_path, gpus=[], warm_child=False, hub_endpoint=endpoint, hub_token=SecretStr(token))


async def test_a_known_token_is_its_users(hub_with_tokens: HubServer, tmp_path: Path) -> None:
    assert await hub_user(settings(tmp_path, hub_with_tokens.endpoint, "hf_known")) == "alice"


async def test_a_refused_token_is_said_and_is_no_ones(hub_with_tokens: HubServer, tmp_path: Path) -> None:
    with capture_logs() as logs:
        assert await hub_user(settings(tmp_path, hub_with_tokens.endpoint, "hf_unknown")) is None
    [said] = [entry for entry in logs if entry["event"] == "hub.token_unusable"]
    assert said["hub"] == hub_with_tokens.endpoint and said["error"].startswith("HfHubHTTPError")


async def test_a_hub_that_is_not_there_is_said_and_the_start_goes_on(tmp_path: Path) -> None:
    with socket.socket() as free:  # a port nothing listens on once it is closed
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with capture_logs() as logs:
        assert await hub_user(settings(tmp_path, f"http://127.0.0.1:{port}", "hf_known")) is None
    assert [entry["event"] for entry in logs] == ["hub.token_unusable"]
