"""Forged events against the real broker and the real command line: whoever can write the events topic
cannot get the fleet's logs token, and cannot make the documented consumer deploy an adapter.

A `started` written by hand (unsigned, signed by another key, or the fleet's signature over other
bytes) naming an endpoint on a listener of the test's is ignored by `adapterd logs`: that listener
receives nothing, while the listener a genuine (fleet-signed) `started` names gets the token and its
log is printed; the command says how many events it ignored. Without keys, `adapterd logs` refuses
to send the token at all. The consumer example deploys a genuine `succeeded` and ignores a forged one.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from pydantic import SecretStr

from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import SIGNATURE_HEADER, Started, Succeeded
from schemas.signing import EventSigner, new_key_pair, read_private_key
from testbed.processes import settings_environment
from tests.daemon.e2e.test_examples_without_torch import example
from tests.helpers import event_document

pytestmark = pytest.mark.slow
TOKEN = "the-fleets-logs-token"


class Listener:
    """An HTTP listener that records what reaches it (path and Authorization) and answers a log."""

    def __init__(self, body: bytes) -> None:
        self.heard: list[tuple[str, str | None]] = []
        heard, answer = self.heard, body

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                heard.append((self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.send_header("Content-Length", str(len(answer)))
                self.send_header("X-Log-Size", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def listeners() -> Iterator[tuple[Listener, Listener]]:
    genuine, thief = Listener(b"step 1 loss 2.0\n"), Listener(b"anything\n")
    yield genuine, thief
    genuine.close()
    thief.close()


def key_pair() -> tuple[EventSigner, str]:
    """A signer and its public key's text, as `adapterd keys` makes them."""
    pem, public = new_key_pair()
    return EventSigner(read_private_key(pem)), public


async def produce(settings: Settings, records: list[tuple[str, bytes, list[tuple[str, bytes]]]]) -> None:
    """Records written to the events topic as anyone allowed to write it can: key, value, headers."""
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        for key, value, headers in records:
            await producer.send_and_wait(settings.events_topic, value, key=key.encode(), headers=headers)
    finally:
        await producer.stop()


def started(request_id: str, endpoint: str) -> bytes:
    return (
        Started(request_id=request_id, method="sft", slot="0", pid=4242, endpoint=endpoint, host="gpu-7")
        .model_dump_json()
        .encode()
    )


def logs(settings: Settings, request_id: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "logs", request_id],
        env=settings_environment(settings),
        capture_output=True,
        timeout=120,
    )


async def test_a_forged_started_never_gets_the_logs_token(
    settings: Settings, listeners: tuple[Listener, Listener]
) -> None:
    genuine, thief = listeners
    (fleet, public), (stranger, _) = key_pair(), key_pair()
    real = started("r-1", genuine.endpoint)
    forged = started("r-1", thief.endpoint)
    await produce(
        settings,
        [
            ("r-1", real, [(SIGNATURE_HEADER, fleet.sign(real))]),  # the fleet's start of r-1
            ("r-1", forged, []),  # then three later starts naming the thief: unsigned,
            ("r-1", forged, [(SIGNATURE_HEADER, stranger.sign(forged))]),  # signed by another key,
            ("r-1", forged, [(SIGNATURE_HEADER, fleet.sign(real))]),  # and the fleet's signature of other bytes
            ("only-forged", started("only-forged", thief.endpoint), []),
        ],
    )
    reader = settings.model_copy(update={"logs_token": SecretStr(TOKEN), "event_verify_keys": [public]})

    read = logs(reader, "r-1")
    assert read.returncode == 0, read.stderr
    assert read.stdout == b"step 1 loss 2.0\n"
    assert genuine.heard == [("/jobs/r-1/log?offset=0", f"Bearer {TOKEN}")]
    assert "ignored 3 event(s)" in read.stderr.decode() and "1 unsigned" in read.stderr.decode()

    only_forged = logs(reader, "only-forged")
    assert only_forged.returncode == 1 and "has not started on any host" in only_forged.stderr.decode()
    assert "ignored 1 event(s)" in only_forged.stderr.decode()

    # Without a key to check them by, the command sends the token nowhere, not even to the genuine host.
    unverified = logs(reader.model_copy(update={"event_verify_keys": []}), "r-1")
    assert unverified.returncode == 1 and "no event_verify_keys" in unverified.stderr.decode()

    assert thief.heard == []  # no request at all, so no token
    assert len(genuine.heard) == 1


async def test_the_consumer_example_deploys_only_what_the_fleet_signed(settings: Settings, tmp_path: Path) -> None:
    fleet, public = key_pair()
    (tmp_path / "keys").write_text(f"# the fleet's event key\n{public}\n")
    real = (
        Succeeded.model_validate(event_document("succeeded", request_id="made-by-the-fleet", published="main"))
        .model_dump_json()
        .encode()
    )
    forged = (
        Succeeded.model_validate(
            event_document("succeeded", request_id="forged", published="main", repo_id="attacker/backdoor")
        )
        .model_dump_json()
        .encode()
    )
    last = (
        Succeeded.model_validate(event_document("succeeded", request_id="last", published="pr", event_id="1" * 32))
        .model_dump_json()
        .encode()
    )
    await produce(
        settings,
        [
            ("forged", forged, []),
            ("made-by-the-fleet", real, [(SIGNATURE_HEADER, fleet.sign(real))]),
            ("forged", forged, [(SIGNATURE_HEADER, fleet.sign(real))]),
            ("last", last, [(SIGNATURE_HEADER, fleet.sign(last))]),
        ],
    )
    consumed = example(
        "consumer.py", settings.bootstrap_servers, "deployers", str(tmp_path / "keys"), "last", settings.events_topic
    )
    assert consumed.returncode == 0, consumed.stderr
    deployed = [line for line in consumed.stdout.splitlines() if line.startswith("deploy ")]
    assert len(deployed) == 1 and "for made-by-the-fleet" in deployed[0] and "attacker/backdoor" not in consumed.stdout
    assert "ignored 2 event(s) without the fleet's signature" in consumed.stdout
