"""What nvidia-smi says of the host's GPUs, one field or several of each (the daemon never imports torch to ask)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping

import structlog

log = structlog.get_logger()


def query_gpus(field: str, environ: Mapping[str, str]) -> list[str] | None:
    """One field of every GPU as nvidia-smi lists them (`--query-gpu`), or None without nvidia-smi
    or when it fails (logged)."""
    nvidia_smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if nvidia_smi is None:
        return None
    try:
        listed = subprocess.run(
            [nvidia_smi, f"--query-gpu={field}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("gpus.discovery_failed", field=field, error=str(exc))
        return None
    return [line.strip() for line in listed.splitlines() if line.strip()]
