"""What `adapterd demo --keep` leaves running: a settings file beside the work for the commands that
try the demo's broker and daemon (its endpoint and logs token, for its owner only), the commands as
typed in the project's folder, and a wait for Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

from daemon.cli.keys import PUBLIC_NAME
from daemon.settings import Settings
from schemas import RequestBase


def kept_settings(settings: Settings) -> dict[str, Any]:
    """What the kept demo's settings file holds, key by key, as the commands that try it need it: its
    broker, work folder and group, the endpoint of its daemon and the token that endpoint serves logs
    to. One more setting is one more entry."""
    return {
        "bootstrap_servers": settings.bootstrap_servers,
        "work_dir": str(settings.work_dir),
        "allowed_local_model_roots": [str(root) for root in settings.allowed_local_model_roots],
        "group_id": settings.group_id,
        "metrics_address": settings.metrics_address,
        "logs_token": settings.logs_token.get_secret_value() if settings.logs_token else None,
        # Its events are signed (doctor says so of this host), and the commands check them by the public
        # key beside the private one.
        "event_signing_key_file": str(settings.event_signing_key_file) if settings.event_signing_key_file else None,
        "event_verify_keys_file": str(settings.event_signing_key_file.parent / PUBLIC_NAME)
        if settings.event_signing_key_file
        else None,
    }


def keep_running_config(settings: Settings) -> Path:
    """A settings file for the commands that try the kept demo (`-c`), beside its work; readable by
    its owner only, since it holds the logs token."""
    path = settings.work_dir / "adapterd.toml"
    lines = ["# The kept demo's broker and daemon (`adapterd demo --keep`): pass this file to the commands with -c."]
    # TOML's basic strings and arrays of them are JSON's: json.dumps writes each value.
    lines += [f"{key} = {json.dumps(value)}" for key, value in kept_settings(settings).items() if value is not None]
    path.touch(mode=0o600)
    path.chmod(0o600)
    path.write_text("\n".join(lines) + "\n")
    return path


def tour(config: Path, request_file: Path, request_id: str, in_project: bool = True) -> list[str]:
    """The commands the kept demo prints, each as typed in the project's folder (`uv run` finds its
    environment there; an installed adapterd is on the PATH): submit a request and follow it, list
    the jobs, one request's history, its log, the daemon's status, the doctor's checks, the events
    as they come, and a cancel."""
    commands = [
        f"submit {request_file} --wait",
        "jobs",
        f"get {request_id}",
        f"logs {request_id}",
        "status",
        "doctor",
        "events --follow",
        f"cancel {request_id}",
    ]
    program = "uv run adapterd" if in_project else "adapterd"
    return [f"{program} {command} -c {config}" for command in commands]


def project_folder() -> Path | None:
    """The checkout this adapterd runs from (where `uv run` works), or None for an installed one."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").is_file() else None


async def keep_running(settings: Settings, request: RequestBase) -> None:
    """Leave the broker and the daemon running, with the commands to try against them, until Ctrl-C or SIGTERM."""
    config = keep_running_config(settings)
    again = request.model_copy(update={"request_id": f"{request.request_id}-again"})
    request_file = settings.work_dir / "request.json"
    request_file.write_text(again.model_dump_json(indent=2, exclude_unset=True) + "\n")
    project = project_folder()
    where = f"in the project's folder ({project})" if project else "where adapterd is installed"
    print(
        f"\nthe broker ({settings.bootstrap_servers}) and the daemon (endpoint {settings.metrics_address}) keep "
        f"running; Ctrl-C stops both. In another terminal, {where}:\n"
    )
    for command in tour(config, request_file, again.request_id, in_project=project is not None):
        print(f"  {command}")
    print(
        f"\na job's own log is {settings.jobs_dir}/<request id>/child.log (adapterd logs reads it through the "
        "daemon's endpoint)"
    )
    print(flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("stopping the daemon and the broker")
