"""How the daemon's HTTP endpoint takes connections: a bounded number at once, each with one
deadline for its whole request, over TLS when the operator gives a certificate.

- A thread per connection (as prometheus_client's own WSGI server does), so a scrape never waits
  on another; at most `max_connections` of them: one more is closed at once, unanswered, so a
  flood of connections cannot grow the daemon's threads without bound.
- One deadline per connection, from its start to its answer's last byte. Every read and write
  waits at most what is left of it (and at most `IDLE_TIMEOUT_S` for one read): a client that
  sends a byte now and then (slow loris) is cut when the deadline passes, not kept for ever by a
  timeout that starts again at each read.
- With TLS, the handshake runs in the connection's thread under the same deadline, never in the
  thread that accepts connections.
"""

from __future__ import annotations

import io
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Callable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import structlog

from schemas.common import AdapterdError

log = structlog.get_logger()

IDLE_TIMEOUT_S = 10.0
REQUEST_DEADLINE_S = 30.0  # a 1 MiB log piece to a slow reader fits in it; a loris gets no more
MAX_CONNECTIONS = 32


class DeadlineExceeded(AdapterdError, TimeoutError):
    """The connection's whole request ran past its deadline."""


class _Deadline:
    def __init__(self, clock: Callable[[], float], seconds: float) -> None:
        self.clock = clock
        self.at = clock() + seconds

    def arm(self, sock: socket.socket, longest: float | None = None) -> None:
        """Let the next socket operation wait at most what is left (and at most `longest`)."""
        left = self.at - self.clock()
        if left <= 0:
            raise DeadlineExceeded("the request's deadline passed")
        sock.settimeout(left if longest is None else min(left, longest))


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes, each read under the deadline (the handler's rfile reads through it)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock, self.deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.deadline.arm(self.sock, IDLE_TIMEOUT_S)
        return self.sock.recv_into(buffer)


class _DeadlineWriter(io.BufferedIOBase):
    """The answer, written under the deadline (socketserver's own writer, with the deadline armed)."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self.sock, self.deadline = sock, deadline

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.deadline.arm(self.sock)  # sendall's timeout bounds the whole call (Python 3.5+)
        self.sock.sendall(data)
        with memoryview(data) as view:
            return view.nbytes


class QuietHandler(WSGIRequestHandler):
    timeout = IDLE_TIMEOUT_S

    def setup(self) -> None:
        server: BoundedServer = self.server  # type: ignore[assignment]
        deadline = _Deadline(server.clock, server.request_deadline_s)
        self.connection = self.request
        if isinstance(self.connection, ssl.SSLSocket):
            deadline.arm(self.connection, IDLE_TIMEOUT_S)
            self.connection.do_handshake()
        # Not StreamRequestHandler.setup's socket files: a file made by makefile() would hold the
        # socket open after its close until the file is collected.
        self.rfile = io.BufferedReader(_DeadlineReader(self.connection, deadline))
        self.wfile = _DeadlineWriter(self.connection, deadline)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not worth a log line


class BoundedServer(socketserver.ThreadingMixIn, WSGIServer):
    """A thread per connection, at most `max_connections` at once, none outliving the daemon."""

    daemon_threads = True

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[WSGIRequestHandler],
        *,
        max_connections: int = MAX_CONNECTIONS,
        request_deadline_s: float = REQUEST_DEADLINE_S,
        clock: Callable[[], float] = time.monotonic,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(address, handler)
        self.slots = threading.BoundedSemaphore(max_connections)
        self.request_deadline_s = request_deadline_s
        self.clock = clock
        if tls is not None:  # the handshake waits for the connection's own thread (QuietHandler.setup)
            self.socket = tls.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            log.debug("http.connection_refused", client=str(client_address[0]), reason="max_connections")
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.slots.release()  # before the close: a client that saw its answer end finds the slot free
            self.shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out, hung up or spoke no TLS is not the daemon's error: dropped
        without a traceback (socketserver's default prints one to stderr)."""
        error = sys.exc_info()[1]
        if isinstance(error, OSError):  # TimeoutError, ssl.SSLError, ConnectionResetError...
            log.debug("http.connection_dropped", client=str(client_address[0]), error=type(error).__name__)
        else:
            log.warning(
                "http.connection_failed", client=str(client_address[0]), error=f"{type(error).__name__}: {error}"
            )
