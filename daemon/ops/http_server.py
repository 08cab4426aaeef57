"""The daemon's local HTTP endpoint: `/metrics` (Prometheus), `/healthz` and `/status` (JSON), and,
with the fleet's `logs_token`, each job's log at `/jobs/ID/log` (`adapterd logs`).

It runs in threads of its own (wsgiref), so a scrape never waits on the Kafka loop; the loop's
state is read through the callables it is given. How it takes connections (a bounded number, a
deadline per request, TLS with the operator's certificate) is daemon/ops/http_connections.py: an
idle or slow client (a port scan, a half-open health check, a slow loris) never keeps `/healthz`
from answering the next for long, nor grows the daemon's threads.
"""

from __future__ import annotations

import hmac
import json
import re
import ssl
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs

import structlog
from prometheus_client import make_wsgi_app

from daemon.errors import ConfigError
from daemon.ops.http_connections import MAX_CONNECTIONS, REQUEST_DEADLINE_S, BoundedServer, QuietHandler

log = structlog.get_logger()

StartResponse = Callable[[str, list[tuple[str, str]]], Any]


def server_tls(certfile: Path, keyfile: Path) -> ssl.SSLContext:
    """The endpoint's TLS from the operator's certificate (its chain after it) and key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(certfile, keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"http_tls_certfile, http_tls_keyfile: cannot load {certfile} with {keyfile}: {exc}") from exc
    return context


# The most of a job's log one answer carries; `adapterd logs` asks again from where it ended.
LOG_CHUNK_BYTES = 2**20
_JOB_LOG = re.compile(r"/jobs/([^/]+)/log")

# A job's log from a byte offset: (its bytes from there, at most `limit`; the log's size), or None
# when this host has no log of that request.
JobLog = Callable[[str, int, int], tuple[bytes, int] | None]


class HttpEndpoint:
    def __init__(
        self,
        address: str,
        health: Callable[[], tuple[bool, dict[str, Any]]],
        status: Callable[[], dict[str, Any]],
        job_log: JobLog | None = None,
        logs_token: str | None = None,
        *,
        tls: ssl.SSLContext | None = None,
        max_connections: int = MAX_CONNECTIONS,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        host, _, port = address.rpartition(":")
        self.health = health
        self.status = status
        self.job_log = job_log
        self.logs_token = logs_token
        self.metrics_app = make_wsgi_app()
        try:
            self.server = BoundedServer(
                (host, int(port)),
                QuietHandler,
                max_connections=max_connections,
                request_deadline_s=request_deadline_s,
                clock=clock,
                tls=tls,
            )
        except OSError as exc:
            raise ConfigError(f"metrics_address: cannot listen on {address}: {exc.strerror}") from exc
        self.server.set_app(self.app)
        self.scheme = "https" if tls is not None else "http"
        self.thread = threading.Thread(target=self.server.serve_forever, name="http-endpoint", daemon=True)

    @property
    def address(self) -> str:
        host, port = cast(tuple[str, int], self.server.server_address[:2])  # an AF_INET server's
        return f"{host}:{port}"

    def start(self) -> HttpEndpoint:
        self.thread.start()
        log.info(
            "http.listening",
            address=self.address,
            scheme=self.scheme,
            paths=["/metrics", "/healthz", "/status", *(["/jobs/ID/log"] if self.logs_token else [])],
        )
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
        return _json(
            start_response, "404 Not Found", {"error": f"no such path {path}; try /metrics, /healthz or /status"}
        )

    def _log(self, request_id: str, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        """A job's log from `?offset=N`, to whoever sends the fleet's logs_token: a log can hold what
        the job's rows said, so without a token this host serves none."""
        if self.logs_token is None or self.job_log is None:
            return _json(start_response, "404 Not Found", {"error": "this host serves no logs: logs_token is not set"})
        sent = environ.get("HTTP_AUTHORIZATION", "")
        if not hmac.compare_digest(sent.encode(), f"Bearer {self.logs_token}".encode()):
            return _json(
                start_response,
                "401 Unauthorized",
                {"error": "send the fleet's logs_token: Authorization: Bearer <token>"},
            )
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
        start_response(
            "200 OK",
            [
                ("Content-Type", "text/plain; charset=utf-8"),
                ("Content-Length", str(len(data))),
                ("X-Log-Size", str(size)),
            ],
        )
        return [data]


def _json(start_response: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body, default=str).encode()
    start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]
