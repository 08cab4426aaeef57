"""The processes and endpoints tests talk to: the daemon as an operator or systemd starts it, a
real sd_notify socket, its HTTP endpoints and metrics, and waiting for a process to be gone."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from daemon.settings import Settings
from schemas import Event
from schemas.signing import new_key_pair
from testbed.client import EVENT_TIMEOUT_S, terminal_events


def write_config(settings: Settings, path: Path) -> Path:
    """The settings as a TOML file an operator would write; the Hub token stays out of it."""
    lines = []
    for name, value in settings.model_dump(mode="json", exclude={"hub_token", "sasl_password"}).items():
        if value is not None:
            lines.append(f"{name} = {json.dumps(value)}")  # JSON strings, numbers, booleans and lists are TOML too
    path.write_text("\n".join(lines) + "\n")
    return path


def unit_daemon(settings: Settings, directory: Path, extra_env: dict[str, str] | None = None) -> DaemonProcess:
    """The daemon as deploy/adapterd.service starts it: its ExecStart command line and its Environment=
    lines, with the config file, the credentials directory (LoadCredential=) and the state directory
    moved under `directory`, and the program taken from this checkout's virtual environment."""
    unit = (Path(__file__).parents[1] / "deploy" / "adapterd.service").read_text()
    config = write_config(settings, directory / "adapterd.toml")
    credentials = directory / "credentials"
    credentials.mkdir(exist_ok=True)
    assert settings.hub_token is not None
    (credentials / "hub-token").write_text(settings.hub_token.get_secret_value() + "\n")
    # The unit loads the fleet's event-signing key as a credential too (LoadCredential=event-signing-key):
    # one made here, unless the settings name the fleet's own.
    signing_key = credentials / "event-signing-key"
    if settings.event_signing_key_file is not None:
        signing_key.write_bytes(settings.event_signing_key_file.read_bytes())
    elif not signing_key.exists():
        signing_key.write_bytes(new_key_pair()[0])

    def place(value: str) -> str:
        return (
            value.replace("/opt/adapterd/.venv/bin", str(Path(sys.executable).parent))
            .replace("/etc/adapterd/adapterd.toml", str(config))
            .replace("/var/lib/adapterd", str(directory / "state"))
            .replace("%d", str(credentials))
        )

    environment = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")}
    command: list[str] = []
    for line in unit.splitlines():
        key, _, value = line.partition("=")
        if key == "Environment":
            name, _, setting = value.partition("=")
            environment[name] = place(setting)
        elif key == "ExecStart":
            command = shlex.split(place(value))
    return DaemonProcess(
        settings, directory / "daemon.log", extra_env=extra_env or {}, command=command, environment=environment
    )


def settings_environment(settings: Settings) -> dict[str, str]:
    """The environment that makes `adapterd run` use `settings`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")}
    for name, value in settings.model_dump(mode="json").items():
        if value is None:
            continue
        secret = getattr(settings, name)
        if isinstance(secret, SecretStr):
            if getattr(settings, f"{name}_file", None) is not None:
                continue  # the daemon reads it from the file, as under systemd
            value = secret.get_secret_value()
        env[f"ADAPTERD_{name.upper()}"] = json.dumps(value) if isinstance(value, list | dict) else str(value)
    env["HF_HOME"] = str(settings.work_dir / "hf-home")
    return env


@dataclass
class DaemonProcess:
    """`adapterd run` as an operator starts it, in a child process of the test."""

    settings: Settings
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    # Instead of `python -m daemon.cli.app run` with the settings in ADAPTERD_* variables: a command
    # line and an environment of its own (the systemd unit's, see `unit_daemon`).
    command: list[str] | None = None
    environment: dict[str, str] | None = None
    cwd: Path | None = None  # the daemon's working directory; the test's own when None

    def start(self) -> DaemonProcess:
        self.settings.work_dir.mkdir(parents=True, exist_ok=True)
        environment = settings_environment(self.settings) if self.environment is None else self.environment
        self.process = subprocess.Popen(
            self.command or [sys.executable, "-m", "daemon.cli.app", "run"],
            env={**environment, **self.extra_env},
            cwd=self.cwd,
            stdout=subprocess.DEVNULL,
            stderr=self.log_path.open("ab"),
        )
        return self

    def __enter__(self) -> DaemonProcess:
        """`with DaemonProcess(...) as daemon:` starts it (unless started) and stops it at the end, however the block
        ends."""
        return self if self.process is not None else self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout_s: float = 60) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log_path.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                lines.append({"event": "raw", "text": line})
        return lines


async def run_to_terminal(daemon: DaemonProcess, request_id: str, timeout_s: float = EVENT_TIMEOUT_S) -> list[Event]:
    """Start `daemon` (a restart, or another host), read a request's events up to its terminal one, and stop it."""
    with daemon:
        return (await terminal_events(daemon.settings, {request_id}, timeout_s))[request_id]


class NotifySocket:
    """A real sd_notify socket, as systemd binds it for a `Type=notify` unit; it collects what the daemon says."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)
        self.lines: list[str] = []
        self.arrivals: list[tuple[float, str]] = []  # (time.monotonic(), line) of every line `listen` took

    async def listen(self) -> None:
        """Take every line as it arrives, with its time, until cancelled (instead of `wait_for`)."""
        loop = asyncio.get_running_loop()
        while True:
            datagram = await loop.sock_recv(self.sock, 65536)
            now = time.monotonic()
            for line in datagram.decode().splitlines():
                self.lines.append(line)
                self.arrivals.append((now, line))

    def watchdog_times(self) -> list[float]:
        """When each WATCHDOG=1 that `listen` took arrived."""
        return [at for at, line in self.arrivals if line == "WATCHDOG=1"]

    def environment(self, watchdog_usec: int | None = None) -> dict[str, str]:
        env = {"NOTIFY_SOCKET": str(self.path)}
        if watchdog_usec is not None:
            env["WATCHDOG_USEC"] = str(watchdog_usec)
        return env

    async def wait_for(self, prefix: str, timeout_s: float = EVENT_TIMEOUT_S) -> str:
        """The first line starting with `prefix` that arrives from now on."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while True:
                datagram = await loop.sock_recv(self.sock, 65536)
                lines = datagram.decode().splitlines()
                self.lines += lines
                for line in lines:
                    if line.startswith(prefix):
                        return line

    def close(self) -> None:
        self.sock.close()


def http_get(address: str, path: str) -> tuple[int, bytes]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def metric(text: str, name: str, **labels: str) -> float | None:
    """One sample's value from a Prometheus text exposition, or None when absent."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


async def wait_until_gone(pid: int, timeout_s: float = 30) -> None:
    """Until the process no longer runs (gone, or a zombie waiting for init to reap it). The kernel
    gives no event to await for another process's death, so this polls /proc."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except (FileNotFoundError, ProcessLookupError):
                return
            if state in ("Z", "X"):
                return
            await asyncio.sleep(0.1)
