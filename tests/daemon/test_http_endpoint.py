"""The daemon's HTTP endpoint answers while another client holds a connection open and says
nothing (a port scan, a half-open health check): a thread per connection. In process, no daemon."""

from __future__ import annotations

import json
import socket
import urllib.request

from daemon.ops import metrics  # noqa: F401 - registers adapterd's metrics, as the daemon does
from daemon.ops.http_server import HttpEndpoint


def test_an_idle_connection_does_not_block_healthz() -> None:
    endpoint = HttpEndpoint("127.0.0.1:0", health=lambda: (True, {"ok": True}), status=lambda: {"jobs": []}).start()
    host, port = endpoint.address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port))):  # connected, sends nothing
            with urllib.request.urlopen(f"http://{endpoint.address}/healthz", timeout=5) as answer:
                assert answer.status == 200 and json.loads(answer.read()) == {"ok": True}
            with urllib.request.urlopen(f"http://{endpoint.address}/metrics", timeout=5) as answer:
                assert b"adapterd_jobs" in answer.read()
    finally:
        endpoint.stop()
