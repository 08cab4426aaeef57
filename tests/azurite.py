"""Azurite, Microsoft's Azure Storage emulator (npm `azurite`), its blob service on the loopback,
in memory: what the Azure tests read `az://` and `abfs://` sources from with adlfs.

The package is installed once per machine under ~/.cache/adapterd/azurite (`.ci/run` does it, and
so does the first test that needs it); 3.35.0 is the last release that declares node 20.
"""

from __future__ import annotations

import subprocess
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers import wait_until_up

VERSION = "3.35.0"
HOME = Path.home() / ".cache" / "adapterd" / "azurite"
ACCOUNT = "devstoreaccount1"
# Azurite's well-known development account (published in its README; no real account has it).
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def ensure_azurite() -> Path:
    """The azurite-blob command, installed from npm if this machine has none yet."""
    command = HOME / "node_modules" / ".bin" / "azurite-blob"
    if not command.exists():
        HOME.mkdir(parents=True, exist_ok=True)
        subprocess.run(["npm", "install", "--prefix", str(HOME), "--no-audit", "--no-fund", f"azurite@{VERSION}"], check=True, capture_output=True)
    return command


def connection_string(port: int) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={KEY};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")


class Azurite:
    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 60) -> Azurite:
        self.process = subprocess.Popen(
            [str(ensure_azurite()), "--blobHost", "127.0.0.1", "--blobPort", str(self.port), "--inMemoryPersistence",
             "--skipApiVersionCheck", "--loose", "--disableTelemetry"],
            stdout=self.log_path.open("ab"), stderr=subprocess.STDOUT,
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
