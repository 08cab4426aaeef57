"""What a running local broker runs on (its Java, its jars folder), written beside adapterd's cache
while it runs, so that `adapterd doctor` on settings that name its address (the demo's `--keep`
settings do) can say so: a record a port, removed when the broker stops, ignored once its process
is gone (a broker killed with its demo leaves one behind).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from daemon.local_broker.jars import cache_root
from daemon.local_broker.java import Java


def _path(port: int) -> Path:
    return cache_root() / "local-brokers" / f"{port}.json"


def record(port: int, java: Java, jar_dir: Path, pid: int) -> None:
    path = _path(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "pid": pid,
                "java": str(java.path),
                "java_version": java.version,
                "java_origin": java.origin,
                "jars": str(jar_dir),
            }
        )
    )


def forget(port: int) -> None:
    _path(port).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def local_broker_at(bootstrap_servers: str) -> dict[str, Any] | None:
    """The record of the local broker these bootstrap servers name, when one of them is a
    live local broker's address."""
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if host not in ("127.0.0.1", "localhost") or not port.isdigit():
            continue
        try:
            found: dict[str, Any] = json.loads(_path(int(port)).read_text())
        except (OSError, ValueError):
            continue
        if _alive(int(found.get("pid", 0))):
            return found
    return None
