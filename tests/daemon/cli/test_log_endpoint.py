"""Where `adapterd logs` sends the fleet's logs token, and what it prints, in process: an endpoint
that answers 302 to another listener gets the answer reported and the other listener nothing; an
endpoint with a path, a user or a scheme is refused before anything is sent; with the fleet's CA
set, an endpoint without TLS gets nothing; the terminal escape codes of a log and of an error's
body are printed escaped, a character split between two pieces whole."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from daemon.cli import logs
from daemon.cli.log_endpoint import LogsError, Printable, fetch, printable
from daemon.ops import metrics  # noqa: F401 - registers adapterd's metrics, as the daemon does
from daemon.ops.http_server import HttpEndpoint
from daemon.settings import Settings
from schemas import Started
from schemas.signing import new_key_pair
from tests.helpers import local_success

TOKEN = "the-fleets-logs-token"
FLEET_KEY = new_key_pair()[
    1
]  # `adapterd logs` acts only on events it can check; the stream here stands in for the verified one


class Recorder(http.server.ThreadingHTTPServer):
    """A listener that notes every request it gets, with its Authorization header; it answers
    `status` with `headers` and `body`."""

    def __init__(self, status: int = 200, headers: dict[str, str] | None = None, body: bytes = b"") -> None:
        self.seen: list[tuple[str, str | None]] = []
        answer = (status, headers or {}, body)
        recorder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(answer[0])
                for name, value in answer[1].items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(answer[2])))
                self.end_headers()
                self.wfile.write(answer[2])

            def log_message(self, format: str, *args: Any) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def catcher() -> Iterator[Recorder]:
    """Another listener, where a forged event or a redirect would like the token to go."""
    server = Recorder(body=b"thanks")
    yield server
    server.shutdown()


def test_a_redirect_to_another_listener_is_reported_and_not_followed(catcher: Recorder) -> None:
    redirector = Recorder(302, {"Location": f"http://{catcher.address}/steal"})
    try:
        with pytest.raises(
            LogsError, match=rf"answered 302; it points to http://{catcher.address}/steal, not followed"
        ):
            fetch(redirector.address, "http", "r1", 0, TOKEN)
    finally:
        redirector.shutdown()
    assert redirector.seen == [("/jobs/r1/log?offset=0", f"Bearer {TOKEN}")]
    assert catcher.seen == []  # the token stayed with the endpoint the event named


@pytest.mark.parametrize(
    "endpoint", ["{catcher}/steal?x=", "user@{catcher}", "http://{catcher}", "{catcher}#", "{catcher}/"]
)
def test_an_endpoint_that_is_not_a_host_and_a_port_gets_nothing(catcher: Recorder, endpoint: str) -> None:
    with pytest.raises(
        LogsError, match="the started event's endpoint is refused, the token not sent: expected host:port"
    ):
        fetch(endpoint.format(catcher=catcher.address), "http", "r1", 0, TOKEN)
    assert catcher.seen == []


def test_with_the_fleets_ca_an_endpoint_without_tls_gets_nothing(tmp_path: Path) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    try:
        for scheme in ("http", None):
            with pytest.raises(
                LogsError, match=f"the host at {address} serves its log without TLS, and http_cafile is set"
            ):
                fetch(address, scheme, "r1", 0, TOKEN, tmp_path / "fleet-ca.pem")
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected
    finally:
        listener.close()


def test_control_characters_are_escaped_and_split_characters_kept_whole() -> None:
    assert printable("a\x1b[2J\x1b]0;pwned\x07b\r\n\tc\x9b\x7f") == "a\\x1b[2J\\x1b]0;pwned\\x07b\\x0d\n\tc\\x9b\\x7f"
    shown = Printable()
    pieces = "loss ✓ 0.5\n".encode()
    split = pieces.index("✓".encode()) + 1  # inside the three bytes of ✓
    assert shown(pieces[:split]) + shown(pieces[split:]) + shown(b"", final=True) == pieces
    assert shown(b"\xff\xfe ok\n", final=True) == b"\\xff\\xfe ok\n"  # not UTF-8: shown as its bytes' values


def test_an_errors_body_is_escaped() -> None:
    hostile = Recorder(500, body=b"oops \x1b]0;owned\x07\x1b[2J")
    try:
        with pytest.raises(LogsError) as error:
            fetch(hostile.address, "http", "r1", 0, TOKEN)
    finally:
        hostile.shutdown()
    assert (
        "\x1b" not in str(error.value)
        and "\x07" not in str(error.value)
        and "oops \\x1b]0;owned\\x07\\x1b[2J" in str(error.value)
    )


class FakeStream:
    """The events of one request, as EventStream would read them from the topic."""

    def __init__(self, events: list[Any]) -> None:
        self.listed = events

    async def __aenter__(self) -> FakeStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def events(self, request_id: str | None = None, **_: object) -> AsyncIterator[Any]:
        for event in self.listed:
            yield event


async def test_adapterd_logs_prints_a_logs_escape_codes_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    log = b"step 1 \x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m\n"
    endpoint = HttpEndpoint(
        "127.0.0.1:0",
        health=lambda: (True, {}),
        status=dict,
        job_log=lambda r, o, n: (log[o : o + n], len(log)),
        logs_token=TOKEN,
    ).start()
    events = [
        Started(request_id="r1", method="sft", slot="cpu", pid=1, endpoint=endpoint.address, endpoint_scheme="http"),
        local_success(
            "r1",
            base_model="m",
        ),
    ]
    monkeypatch.setattr(logs, "EventStream", lambda settings: FakeStream(events))
    printed: list[bytes] = []
    try:
        await logs.show_log(
            Settings(logs_token=SecretStr(TOKEN), event_verify_keys=[FLEET_KEY]), "r1", False, printed.append
        )
    finally:
        endpoint.stop()
    assert b"".join(printed) == b"step 1 \\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\x1b[0m\n"


async def test_a_host_name_with_escape_codes_is_said_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    events = [
        Started(request_id="r1", method="sft", slot="cpu", pid=1, host="evil\x1b[2J\x1b]0;t\x07")
    ]  # a host serving no logs
    monkeypatch.setattr(logs, "EventStream", lambda settings: FakeStream(events))
    with pytest.raises(LogsError) as error:
        await logs.show_log(
            Settings(logs_token=SecretStr(TOKEN), event_verify_keys=[FLEET_KEY]), "r1", False, lambda data: None
        )
    assert str(error.value) == "evil\\x1b[2J\\x1b]0;t\\x07 runs r1 but serves no logs: its logs_token is not set"
