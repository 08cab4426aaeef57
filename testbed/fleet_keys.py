"""The keys a fleet with priority classes must have (daemon/settings/__init__.py `_classes_trust`,
daemon/fleet/wiring.py `require_fleet_retry_key`), made for the tests and the benchmarks: one event signing key every
host signs with (and so trusts) and one retry key."""

from __future__ import annotations

import secrets
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from schemas.signing import new_key_pair


def fleet_keys(folder: Path) -> dict[str, Any]:
    """Settings overrides naming a new signing key and retry key, written into `folder` (made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    private, _ = new_key_pair()
    (folder / "event-signing-key.pem").write_bytes(private)
    (folder / "retry-key").write_text(secrets.token_hex(32))
    return {"event_signing_key_file": folder / "event-signing-key.pem", "retry_key_file": folder / "retry-key"}


@cache
def shared_fleet_keys() -> dict[str, Any]:
    """`fleet_keys` in a folder of this process's own, for settings made where no test folder is at hand."""
    return fleet_keys(Path(tempfile.mkdtemp(prefix="adapterd-fleet-keys-")))
