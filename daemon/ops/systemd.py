"""Telling systemd how the daemon is doing (`Type=notify`): ready, stopping, alive, and more time to stop.

The protocol is one datagram per message to the socket named in $NOTIFY_SOCKET; without it (not
under systemd) every call does nothing. It is a few lines, so no library: the one on PyPI
(`sdnotify`) has not been released since 2017 and lacks abstract sockets.
"""

from __future__ import annotations

import os
import socket
import time

import structlog

log = structlog.get_logger()


class Notifier:
    def __init__(self, environ: dict[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        self.address = "\0" + address[1:] if address.startswith("@") else address  # '@' names an abstract socket
        self.watchdog_interval_s = self._watchdog_interval(env)
        self._last_fed = float("-inf")

    @staticmethod
    def _watchdog_interval(env: os._Environ[str] | dict[str, str]) -> float | None:
        """Half systemd's watchdog period, the feeding interval it asks for; None when it has no watchdog for us."""
        usec, pid = env.get("WATCHDOG_USEC"), env.get("WATCHDOG_PID")
        if not usec or (pid and int(pid) != os.getpid()):
            return None
        return int(usec) / 2 / 1_000_000

    def send(self, *lines: str) -> None:
        if not self.address:
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            try:
                sock.sendto("\n".join(lines).encode(), self.address)
            except OSError as exc:
                log.warning("systemd.notify_failed", socket=self.address, error=str(exc))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={status}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={status}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={status}")

    def extend_stop(self, seconds: float) -> None:
        """Ask for `seconds` more before systemd's stop timeout kills us (jobs are checkpointing)."""
        self.send(f"EXTEND_TIMEOUT_USEC={int(seconds * 1_000_000)}")

    def feed_watchdog(self) -> None:
        """Called from the Kafka loop: while it keeps turning, systemd sees the daemon alive."""
        if self.watchdog_interval_s is None:
            return
        now = time.monotonic()
        if now - self._last_fed >= self.watchdog_interval_s:
            self._last_fed = now
            self.send("WATCHDOG=1")
