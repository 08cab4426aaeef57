"""One piece of a job's log from the endpoint a `started` event named, the fleet's logs token sent
only where it belongs; and what the endpoint said, made safe to print.

Where the token goes is decided here, not by the event's text nor by the endpoint's answers:
- the address is a host and a port, checked again here (schemas/addresses.py), and the request is
  built from the host, the port and a path of this module's own, so nothing in an event can add a
  path, a query, a user or another scheme;
- http.client sends one request to that host and port: a redirect (302 to another port or host)
  is an answer like any other, reported and never followed, and no proxy of the environment is
  asked;
- with `http_cafile` the token goes over verified TLS only (an event that says `http` is refused
  before anything is sent); an event that says `https` is verified against the fleet's CA or, with
  none, the system's.
Everything printed from an endpoint (the log, an error's body) has its control characters escaped,
so a log cannot drive the operator's terminal (escape sequences, a cleared screen, a changed title).
"""

from __future__ import annotations

import codecs
import http.client
import re
import ssl
from pathlib import Path
from urllib.parse import quote

from schemas.addresses import split_host_port
from schemas.common import AdapterdError

TIMEOUT_S = 30.0
# The C0 controls but newline and tab, DEL and the C1 controls (0x9b is a one-byte CSI to some terminals).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


class LogsError(AdapterdError):
    """Why a request's log cannot be read: said on one line, exit 1."""


def printable(text: str) -> str:
    """`text` with each control character but newline and tab written as an escape (\\x1b)."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


class Printable:
    """A log's bytes as they arrive, piece by piece, as safe UTF-8 to print: control characters
    escaped, bytes that are not UTF-8 written as \\xNN, a character split between two pieces whole."""

    def __init__(self) -> None:
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="backslashreplace")

    def __call__(self, data: bytes, final: bool = False) -> bytes:
        return printable(self.decoder.decode(data, final)).encode()


def client_tls(cafile: Path | None) -> ssl.SSLContext:
    """Verified TLS: against the fleet's CA when the operator names one, else the system's."""
    try:
        return ssl.create_default_context(cafile=str(cafile) if cafile else None)
    except (OSError, ssl.SSLError) as exc:
        raise LogsError(f"http_cafile: cannot load {cafile}: {exc}") from exc


def fetch(
    endpoint: str,
    scheme: str | None,
    request_id: str,
    offset: int,
    token: str,
    cafile: Path | None = None,
    limit: int = 2**20,
) -> tuple[bytes, int]:
    """Up to `limit` bytes of a job's log from `offset`, and the log's size; a LogsError says why not."""
    try:
        host, port = split_host_port(endpoint)
    except ValueError as exc:
        raise LogsError(f"the started event's endpoint is refused, the token not sent: {printable(str(exc))}") from exc
    if cafile is not None and scheme != "https":
        raise LogsError(
            f"the host at {endpoint} serves its log without TLS, and http_cafile is set: the token goes over TLS only"
        )
    connection = (
        http.client.HTTPSConnection(host, port, timeout=TIMEOUT_S, context=client_tls(cafile))
        if scheme == "https"
        else http.client.HTTPConnection(host, port, timeout=TIMEOUT_S)
    )
    try:
        connection.request(
            "GET",
            f"/jobs/{quote(request_id, safe='')}/log?offset={int(offset)}",
            headers={"Authorization": f"Bearer {token}"},
        )
        response = connection.getresponse()
        body = response.read(limit + 1)
        if response.status != 200:
            said = printable(body[:300].decode(errors="replace"))
            where = (
                f"; it points to {printable(response.getheader('Location', ''))[:200]}, not followed"
                if 300 <= response.status < 400
                else ""
            )
            raise LogsError(f"{endpoint} answered {response.status}{where}: {said}")
        if len(body) > limit:
            raise LogsError(f"{endpoint} answered more than the {limit} bytes a piece of a log has")
        return body, int(response.getheader("X-Log-Size", "0"))
    except ssl.SSLCertVerificationError as exc:  # in the handshake, before the request: the token stayed here
        raise LogsError(
            f"the host at {endpoint} is not proven by its certificate ({exc.verify_message}): the token was not sent"
        ) from exc
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise LogsError(f"the host at {endpoint} does not answer: {printable(str(exc))}") from exc
    finally:
        connection.close()
