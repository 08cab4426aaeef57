"""A local stand-in for the Hugging Face Hub: the part of its HTTP API that `huggingface_hub` and
`datasets` use to create repos, commit files, and download files and snapshots.

It keeps everything it receives in memory so tests can check it, and can inject faults
(`HubServer.fail(...)`), or answer late (`HubServer.slow_down(...)`: slow safetensors headers, say),
to show how the daemon behaves when the real Hub misbehaves. The state is
`testbed/hub_state.py`'s; `testbed/hub_http.py` answers the HTTP requests; this module runs the server.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import ThreadingHTTPServer

from testbed.hub_http import HubRequestHandler
from testbed.hub_state import HubState


@dataclass
class HubServer(HubState):
    host: str = "127.0.0.1"
    port: int = 0
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> HubServer:
        hub = self

        class Handler(HubRequestHandler):
            server_state = hub

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="hub-server", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
