"""`adapterd hold ID`, `release ID`, `pause ID`, `resume ID`, and the same four from Python: what the request's events
say of it, and what the message will do, then the message sent to the control topic as `adapterd cancel` sends one
(daemon/cli/cancel.py). Every daemon reads it and remembers the hold until a release (daemon/jobs/holds.py).

    from daemon.cli.holds import pause
    said = await pause(settings, "sweep-004", reason="free the GPUs")
"""

from __future__ import annotations

from daemon.cli.cancel import ENDED, Plan, send_when_it_can
from daemon.cli.jobs import RequestSummary
from daemon.settings import Settings
from schemas import Hold, Pause, Release, Resume

HoldMessage = Hold | Release | Pause | Resume

# What each does, by the request's state: running, waiting (queued or held), never seen.
_DOES = {
    "hold": (
        "a running job is left to run (pause it to stop it); it is not started again while held",
        "it is not started while held; the requests behind it go first (`held`)",
    ),
    "pause": (
        "its host stops the job at a checkpoint, and it waits held (`paused`); resume starts it there",
        "it is not started while held; the requests behind it go first (`held`)",
    ),
    "release": ("nothing to release: it runs", "it waits as any other and starts when reached (`released`)"),
    "resume": ("nothing to resume: it runs", "it waits as any other and resumes from its checkpoint (`released`)"),
}


def plan(message: HoldMessage, job: RequestSummary | None, control_topic: str) -> Plan:
    """Whether to send `message`, and what is known and will happen, from the request's folded events (None: none)."""
    request_id, kind = message.request_id, message.type
    running, waiting = _DOES[kind]
    if job is None:
        return Plan(
            True,
            f"{request_id}: never seen (no host published an event of it); the {kind} is sent to {control_topic}: "
            f"when a daemon reaches it, {waiting}; if the id is mistyped, nothing happens",
        )
    if job.state in ENDED:
        return Plan(False, f"{request_id}: already {job.state} on {job.host}; nothing to {kind}, nothing sent")
    where = "running" if job.state == "running" else job.state
    does = running if job.state == "running" else waiting
    return Plan(True, f"{request_id}: {where} on {job.host}; the {kind} is sent to {control_topic}: {does}")


async def send(settings: Settings, message: HoldMessage, *, dry_run: bool = False) -> str:
    """Read the request's state, send `message` when it can still do something (not on a dry run), and say what
    happens."""
    return await send_when_it_can(
        settings, message, lambda job: plan(message, job, settings.control_topic), dry_run=dry_run
    )


async def hold(settings: Settings, request_id: str, reason: str = "") -> str:
    return await send(settings, Hold(request_id=request_id, reason=reason))


async def release(settings: Settings, request_id: str, reason: str = "") -> str:
    return await send(settings, Release(request_id=request_id, reason=reason))


async def pause(settings: Settings, request_id: str, reason: str = "") -> str:
    return await send(settings, Pause(request_id=request_id, reason=reason))


async def resume(settings: Settings, request_id: str, reason: str = "") -> str:
    return await send(settings, Resume(request_id=request_id, reason=reason))
