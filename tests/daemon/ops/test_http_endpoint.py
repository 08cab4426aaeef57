"""The daemon's HTTP endpoint, in process, no daemon: it answers while another client holds a
connection open and says nothing (a thread per connection); it takes at most `max_connections` at
once; a client that sends its request a byte at a time is cut at the request's deadline, however
often it sends; a job's `child.log` (or its folder) that is a link is not followed; over TLS with
a certificate made here, the token and the log go through, and a client that trusts another CA
sends nothing."""

from __future__ import annotations

import functools
import json
import os
import socket
import threading
import urllib.request
from pathlib import Path

import pytest

from daemon.cli.log_endpoint import LogsError, fetch
from daemon.ops import metrics  # noqa: F401 - registers adapterd's metrics, as the daemon does
from daemon.ops.http_server import HttpEndpoint, server_tls
from daemon.ops.job_logs import read_job_log
from daemon.ops.local_endpoint import local_url
from daemon.settings import Settings
from tests.certificates import make_certificates

TOKEN = "the-fleets-logs-token"


class SteppedClock:
    """A clock the test moves by hand. Each reading is counted: the endpoint reads it when a
    connection starts (its deadline) and before each read, so the test knows where the server is."""

    def __init__(self) -> None:
        self.now = 0.0
        self.readings = 0
        self.read = threading.Condition()

    def __call__(self) -> float:
        with self.read:
            self.readings += 1
            self.read.notify_all()
            return self.now

    def wait_for(self, readings: int) -> None:
        with self.read:
            assert self.read.wait_for(lambda: self.readings >= readings, timeout=30), (
                f"{self.readings} readings, not {readings}"
            )


def healthy_endpoint(**options: object) -> HttpEndpoint:
    return HttpEndpoint(
        "127.0.0.1:0", health=lambda: (True, {"ok": True}), status=lambda: {"jobs": []}, **options
    ).start()  # type: ignore[arg-type]


def connect(endpoint: HttpEndpoint) -> socket.socket:
    host, port = endpoint.address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def read_to_end(connection: socket.socket) -> bytes:
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    return received


def test_an_idle_connection_does_not_block_healthz() -> None:
    endpoint = healthy_endpoint()
    try:
        with connect(endpoint):  # connected, sends nothing
            with urllib.request.urlopen(f"http://{endpoint.address}/healthz", timeout=5) as answer:
                assert answer.status == 200 and json.loads(answer.read()) == {"ok": True}
            with urllib.request.urlopen(f"http://{endpoint.address}/metrics", timeout=5) as answer:
                assert b"adapterd_jobs" in answer.read()
    finally:
        endpoint.stop()


def test_connections_beyond_the_cap_are_closed_unanswered_and_a_freed_slot_serves_again() -> None:
    clock = SteppedClock()
    endpoint = healthy_endpoint(max_connections=2, clock=clock)
    try:
        with connect(endpoint) as first, connect(endpoint):
            clock.wait_for(4)  # both taken: each connection's deadline read, then its first read armed
            with connect(endpoint) as third:
                third.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                assert read_to_end(third) == b""  # closed at once: a thread per connection, but no more than two
            first.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            assert read_to_end(first).startswith(b"HTTP/1.0 200")  # its slot is free once its answer ended
            with urllib.request.urlopen(f"http://{endpoint.address}/healthz", timeout=30) as answer:
                assert answer.status == 200
    finally:
        endpoint.stop()


def test_a_slow_loris_is_cut_at_the_requests_deadline_though_each_byte_comes_in_time() -> None:
    clock = SteppedClock()
    endpoint = healthy_endpoint(request_deadline_s=5.0, clock=clock)
    request = b"GET /healthz HTTP/1.0\r\n\r\n"
    try:
        with connect(endpoint) as loris:
            clock.wait_for(2)  # the deadline set (t=0) and the first read armed
            for second, byte in enumerate(request[:5], start=1):
                clock.now = float(second)  # a byte a second: each read waits far less than the 10 s idle timeout
                loris.sendall(bytes([byte]))
                clock.wait_for(2 + second)  # the server took it and armed its next read; at t=5 the deadline has passed
            try:
                loris.sendall(request[5:])  # the rest, at once: too late
            except OSError:
                pass
            answer = read_to_end(loris)
        assert answer == b"", answer  # cut, unanswered
        with urllib.request.urlopen(f"http://{endpoint.address}/healthz", timeout=30) as healthz:
            assert healthz.status == 200
    finally:
        endpoint.stop()


@pytest.fixture
def jobs_dir(tmp_path: Path) -> Path:
    """A job with its log; one whose child.log links to a secret; one whose folder links to another job's."""
    jobs = tmp_path / "jobs"
    (jobs / "plain").mkdir(parents=True)
    (jobs / "plain" / "child.log").write_bytes(b"step 1 loss 2.0\n")
    (tmp_path / "secret").write_text("hf_the_hosts_token\n")
    (jobs / "linked-log").mkdir()
    (jobs / "linked-log" / "child.log").symlink_to(tmp_path / "secret")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "child.log").write_text("hf_the_hosts_token\n")
    (jobs / "linked-folder").symlink_to(elsewhere)
    (jobs / "fifo").mkdir()
    os.mkfifo(jobs / "fifo" / "child.log")
    return jobs


def test_a_jobs_log_that_is_a_link_or_not_a_file_is_not_served(jobs_dir: Path) -> None:
    assert read_job_log(jobs_dir, "plain", 5, 100) == (b"1 loss 2.0\n", 16)
    for request_id in ("linked-log", "linked-folder", "..", "../secret"):
        assert read_job_log(jobs_dir, request_id, 0, 100) is None, request_id
    found: list[object] = []
    reading = threading.Thread(target=lambda: found.append(read_job_log(jobs_dir, "fifo", 0, 100)), daemon=True)
    reading.start()
    reading.join(timeout=30)
    assert found == [None]  # a FIFO with no writer answers none, at once: it never holds the endpoint's thread

    endpoint = healthy_endpoint(job_log=functools.partial(read_job_log, jobs_dir), logs_token=TOKEN)
    try:
        assert fetch(endpoint.address, "http", "plain", 0, TOKEN) == (b"step 1 loss 2.0\n", 16)
        for request_id in ("linked-log", "linked-folder"):
            with pytest.raises(LogsError, match=f"answered 404: .*no log of {request_id} on this host") as refused:
                fetch(endpoint.address, "http", request_id, 0, TOKEN)
            assert "hf_the_hosts_token" not in str(refused.value)
    finally:
        endpoint.stop()


def test_tls_end_to_end_with_the_operators_certificate(tmp_path: Path) -> None:
    fleet, other = make_certificates(tmp_path / "fleet", "fleet"), make_certificates(tmp_path / "other", "other")
    served: list[str] = []

    def job_log(request_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        served.append(request_id)  # reached only with the token
        return b"over tls\n"[offset:], 9

    endpoint = healthy_endpoint(job_log=job_log, logs_token=TOKEN, tls=server_tls(fleet.cert, fleet.key))
    try:
        assert fetch(endpoint.address, "https", "r1", 0, TOKEN, fleet.ca) == (b"over tls\n", 9)
        assert served == ["r1"]
        with pytest.raises(LogsError, match="not proven by its certificate .*the token was not sent"):
            fetch(endpoint.address, "https", "r2", 0, TOKEN, other.ca)  # another fleet's CA: the handshake fails first
        with pytest.raises(LogsError, match="not proven by its certificate"):
            fetch(endpoint.address, "https", "r3", 0, TOKEN, None)  # the system's CAs do not know the fleet's
        with pytest.raises(LogsError, match="does not answer"):
            fetch(endpoint.address, "http", "r4", 0, TOKEN, None)  # plain HTTP to the TLS endpoint gets nothing
        with pytest.raises(OSError):  # plain HTTP gets no answer either
            urllib.request.urlopen(f"http://{endpoint.address}/healthz", timeout=30)
        assert served == ["r1"]
        # This host's own commands (status, doctor) reach it too: against the fleet's CA, or
        # the endpoint's certificate alone.
        for cafile in (fleet.ca, None):
            settings = Settings(
                metrics_address=endpoint.address,
                http_tls_certfile=fleet.cert,
                http_tls_keyfile=fleet.key,
                http_cafile=cafile,
            )
            url, tls = local_url(settings, "/healthz")
            with urllib.request.urlopen(url, timeout=30, context=tls) as healthz:
                assert url.startswith("https://") and json.loads(healthz.read()) == {"ok": True}
    finally:
        endpoint.stop()
