"""`adapterd logs` across two daemons: each reads its own requests topic, both publish to one events
topic, and each request's trainer log is read from the host that ran it, through that host's endpoint
and the fleet's logs_token, byte for byte (the hosts sign their events, the reader checks them); followed
live, to its end, from a host serving HTTPS with a certificate made here; refused to another token, and
to none; and with the fleet's CA set, the plain HTTP host gets no token."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import SecretStr

from daemon.kafka.admin.topics import ensure_topics
from daemon.local_broker import free_port
from daemon.settings import Settings
from schemas import Started, Succeeded
from schemas.signing import new_key_pair
from testbed.client import submit, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, settings_environment
from tests.certificates import make_certificates
from tests.helpers import sft_request

pytestmark = pytest.mark.slow
TOKEN = SecretStr("the-fleets-logs-token")


def logs_command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "daemon.cli.app", "logs", *argv]


async def test_each_requests_log_comes_from_the_host_that_ran_it(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    fleet = make_certificates(tmp_path / "tls")  # host b serves HTTPS with a certificate of the fleet's CA
    signing_key, public_key = new_key_pair()  # the fleet's: both hosts sign their events with it
    (tmp_path / "event-signing-key.pem").write_bytes(signing_key)
    hosts = {
        name: settings.model_copy(
            update={
                "host": f"host-{name}",
                "logs_token": TOKEN,
                "work_dir": tmp_path / name,
                "metrics_address": f"127.0.0.1:{free_port()}",
                "requests_topic": f"{settings.requests_topic}-{name}",
                "group_id": f"{settings.group_id}-{name}",
                **({"http_tls_certfile": fleet.cert, "http_tls_keyfile": fleet.key} if name == "b" else {}),
                "event_signing_key_file": tmp_path / "event-signing-key.pem",
            }
        )
        for name in ("a", "b")
    }
    for host in hosts.values():
        await ensure_topics(host)
    # An operator's machine: the events topic, the token, and the fleet's public key to check the events by.
    reader = settings.model_copy(update={"logs_token": TOKEN, "event_verify_keys": [public_key]})
    tls_reader = reader.model_copy(update={"http_cafile": fleet.ca})  # ...that trusts the fleet's CA: TLS only
    daemons = [DaemonProcess(host, tmp_path / f"daemon-{name}.log").start() for name, host in hosts.items()]
    try:
        # Followed before it exists: the command waits for its start, then copies the log as it grows, until its end.
        following = await asyncio.create_subprocess_exec(
            *logs_command("on-b", "--follow"),
            env=settings_environment(tls_reader),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        await submit(hosts["a"], sft_request("on-a"))
        await submit(hosts["b"], sft_request("on-b"))
        events = await terminal_events(settings, {"on-a", "on-b"})
        followed, followed_err = await asyncio.wait_for(following.communicate(), 120)
        # After the fact, from host a: with the fleet's token, another, and none.
        right = subprocess.run(logs_command("on-a"), env=settings_environment(reader), capture_output=True, timeout=120)
        # With the fleet's CA set, host a's plain HTTP endpoint gets no token.
        plain = subprocess.run(
            logs_command("on-a"), env=settings_environment(tls_reader), capture_output=True, timeout=120
        )
        other = reader.model_copy(update={"logs_token": SecretStr("not-the-fleets-token")})
        wrong = subprocess.run(logs_command("on-a"), env=settings_environment(other), capture_output=True, timeout=120)
        unset = reader.model_copy(update={"logs_token": None})
        without = subprocess.run(
            logs_command("on-a"), env=settings_environment(unset), capture_output=True, timeout=120
        )
    finally:
        for daemon in daemons:
            daemon.stop()

    for name, request_id in (("a", "on-a"), ("b", "on-b")):
        assert isinstance(events[request_id][-1], Succeeded), events[request_id][-1]
        [started] = [event for event in events[request_id] if isinstance(event, Started)]
        assert started.host == f"host-{name}" and started.endpoint == hosts[name].metrics_address
        assert started.endpoint_scheme == {"a": "http", "b": "https"}[name]
    assert following.returncode == 0, followed_err
    on_disk = {
        request_id: (tmp_path / name / "jobs" / request_id / "child.log").read_bytes()
        for name, request_id in (("a", "on-a"), ("b", "on-b"))
    }
    assert on_disk["on-b"] and followed == on_disk["on-b"]
    assert right.returncode == 0 and right.stdout == on_disk["on-a"] != on_disk["on-b"]
    assert plain.returncode == 1 and not plain.stdout, plain.stderr
    assert (
        f"the host at {hosts['a'].metrics_address} serves its log without TLS, and http_cafile is set"
        in plain.stderr.decode()
    )
    assert (
        wrong.returncode == 1 and "answered 401" in wrong.stderr.decode() and not wrong.stdout
    )  # a host serves its logs only to the token
    assert without.returncode == 1 and "logs_token is not set" in without.stderr.decode()

    # After the fact, with the hosts' daemons stopped: their endpoints are gone, and the command says so.
    gone = subprocess.run(logs_command("on-a"), env=settings_environment(reader), capture_output=True, timeout=120)
    assert gone.returncode == 1 and f"the host at {hosts['a'].metrics_address} does not answer" in gone.stderr.decode()
