"""An MLflow tracking server on the loopback (SQLite and a folder of artifacts, in the test's own
folder), run from an environment of its own: mlflow 3.17's server pins a pyarrow older than the
project's. The project's environment has only the client (mlflow-skinny), which transformers'
MLflowCallback reports through, as on an operator's host.

The server's environment is made once per machine under adapterd's cache folder (`~/.cache/adapterd/mlflow-venv`) with
uv (`.ci/run` does it, and so does the first test that needs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from daemon.local_broker.jars import cache_root
from tests.helpers import wait_until_up

VERSION = "3.17.2"


def venv() -> Path:
    return cache_root() / "mlflow-venv"


def ensure_mlflow() -> Path:
    """The `mlflow` command of the server's own environment, made if this machine has none yet."""
    command = venv() / "bin" / "mlflow"
    if not command.exists():
        uv = os.environ.get("UV") or shutil.which("uv")  # `uv run` says where its uv is
        assert uv, "uv makes the MLflow server's environment: pip install uv (as the README says)"
        # This interpreter: one uv need not download (a machine may have no Python 3.11).
        subprocess.run([uv, "venv", "-q", str(venv()), "--python", sys.executable], check=True)
        subprocess.run(
            [uv, "pip", "install", "-q", "--python", str(venv() / "bin" / "python"), f"mlflow=={VERSION}"], check=True
        )
    return command


class MlflowServer:
    def __init__(self, port: int, folder: Path) -> None:
        self.port = port
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 120) -> MlflowServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                str(ensure_mlflow()),
                "server",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{self.folder / 'mlflow.db'}",
                "--artifacts-destination",
                str(self.folder / "artifacts"),
            ],
            env={
                "PATH": f"{venv() / 'bin'}:/usr/bin:/bin",
                "HOME": str(Path.home()),
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
            },
            stdout=(self.folder / "server.log").open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_until_up(
            self._healthy, self.process, "the MLflow server", self.folder / "server.log", timeout_s
        )  # /health answering
        return self

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as answer:
                return answer.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
