"""The daemon's local HTTP endpoint: `/metrics` (Prometheus), `/healthz` and `/status` (JSON), and,
with the fleet's `logs_token`, each job's log at `/jobs/ID/log` (`adapterd logs`).

It runs in threads of its own (wsgiref), so a scrape never waits on the Kafka loop; the loop's
state is read through the callables it is given. Each connection gets its own thread, and one
that sends nothing is dropped after `IDLE_TIMEOUT_S`: an idle or slow client (a port scan, a
half-open health check) never keeps `/healthz` from answering the next.
"""

from __future__ import annotations

import hmac
import json
import re
import socketserver
import threading
from collections.abc import Callable, Iterable
from typing import Any, cast
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import make_wsgi_app

from daemon.errors import ConfigError

log = structlog.get_logger()

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


IDLE_TIMEOUT_S = 10.0


class _QuietHandler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S  # socketserver sets it on the connection: a silent client is dropped

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not worth a log line


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per connection (as prometheus_client's own WSGI server does), none outliving the daemon."""

    daemon_threads = True


# The most of a job's log one answer carries; `adapterd logs` asks again from where it ended.
LOG_CHUNK_BYTES = 2**20
_JOB_LOG = re.compile(r"/jobs/([^/]+)/log")

# A job's log from a byte offset: (its bytes from there, at most `limit`; the log's size), or None
# when this host has no log of that request.
JobLog = Callable[[str, int, int], tuple[bytes, int] | None]


class HttpEndpoint:
    def __init__(
        self, address: str, health: Callable[[], tuple[bool, dict[str, Any]]], status: Callable[[], dict[str, Any]],
        job_log: JobLog | None = None, logs_token: str | None = None,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.health = health
        self.status = status
        self.job_log = job_log
        self.logs_token = logs_token
        self.metrics_app = make_wsgi_app()
        try:
            self.server: WSGIServer = make_server(host, int(port), self.app, server_class=_ThreadingServer, handler_class=_QuietHandler)
        except OSError as exc:
            raise ConfigError(f"metrics_address: cannot listen on {address}: {exc.strerror}") from exc
        self.thread = threading.Thread(target=self.server.serve_forever, name="http-endpoint", daemon=True)

    @property
    def address(self) -> str:
        host, port = cast(tuple[str, int], self.server.server_address[:2])  # an AF_INET server's
        return f"{host}:{port}"

    def start(self) -> HttpEndpoint:
        self.thread.start()
        log.info("http.listening", address=self.address, paths=["/metrics", "/healthz", "/status", *(["/jobs/ID/log"] if self.logs_token else [])])
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def app(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/")
        if path == "/metrics":
            return self.metrics_app(environ, start_response)
        if path == "/healthz":
            healthy, detail = self.health()
            return _json(start_response, "200 OK" if healthy else "503 Service Unavailable", detail)
        if path == "/status":
            return _json(start_response, "200 OK", self.status())
        if (match := _JOB_LOG.fullmatch(path)) is not None:
            return self._log(match.group(1), environ, start_response)
        return _json(start_response, "404 Not Found", {"error": f"no such path {path}; try /metrics, /healthz or /status"})

    def _log(self, request_id: str, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """A job's log from `?offset=N`, to whoever sends the fleet's logs_token: a log can hold what
        the job's rows said, so without a token this host serves none."""
        if self.logs_token is None or self.job_log is None:
            return _json(start_response, "404 Not Found", {"error": "this host serves no logs: logs_token is not set"})
        sent = environ.get("HTTP_AUTHORIZATION", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {self.logs_token}".encode()):
            return _json(start_response, "401 Unauthorized", {"error": "send the fleet's logs_token: Authorization: Bearer <token>"})
        query = parse_qs(environ.get("QUERY_STRING", ""))
        try:
            offset = int(query.get("offset", ["0"])[0])
        except ValueError:
            offset = -1
        if offset < 0:
            return _json(start_response, "400 Bad Request", {"error": "offset: a byte offset, 0 or more"})
        found = self.job_log(request_id, offset, LOG_CHUNK_BYTES)
        if found is None:
            return _json(start_response, "404 Not Found", {"error": f"no log of {request_id} on this host"})
        data, size = found
        start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(data))), ("X-Log-Size", str(size))])
        return [data]


def _json(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body, default=str).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
