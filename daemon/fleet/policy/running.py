"""The jobs running anywhere in the fleet, folded from the events every host reads: what `etas` needs to
say when each waiting request starts, and what the fair share counts as work already under way.
Pure: no Kafka, no clock; the caller feeds each event with `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from daemon.fleet.policy.order import FleetJob
from daemon.fleet.policy.usage import slots_of
from daemon.settings.fleet import team_of
from schemas import (
    Accepted,
    Cancelled,
    Checkpoint,
    Event,
    Failed,
    Paused,
    Preempted,
    Progress,
    Retrying,
    Started,
    Succeeded,
)

TERMINAL = (Succeeded, Failed, Cancelled)


@dataclass(frozen=True)
class _Seen:
    """A running job as its events describe it so far."""

    job: FleetJob
    eta_at: float | None = None  # when its last progress event's ETA was given
    step: int | None = None  # its last progress event's step
    saved: int = 0  # the step its last checkpoint holds (or it resumed from)


class Occupancy:
    """Each request between its `accepted` event and its terminal, `retrying` or `preempted` one: its class,
    team, method, host, start, GPUs (from `started`), the ETA its last `progress` event gave, the steps since
    its last checkpoint, and how often it was preempted; its model and steps left from a fleet host's `accepted`
    (else the model is '' and `Durations.expected` falls back to the method's median). They do not say whether
    the job may stop now (`preemptible` is False: only the host running it preempts it, from its own jobs)."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}
        self._preemptions: dict[str, int] = {}  # request id → times preempted, until its terminal event

    def observe(self, event: Event, now: float) -> None:
        request_id = event.request_id
        if request_id is None:
            return
        at = min(event.time.timestamp(), now)
        seen = self._seen.get(request_id)
        if isinstance(event, Accepted):
            # Its model and max_steps (a fleet host's `accepted` names them): before its first progress it is expected
            # at its own length, not the method's median job's.
            self._seen[request_id] = _Seen(
                FleetJob(
                    request_id,
                    event.priority_class or "",
                    team_of(event.team),
                    at,
                    event.method,
                    event.model or "",
                    preemptions=self._preemptions.get(request_id, 0),
                    host=event.host,
                    steps_left=event.max_steps,
                )
            )
        elif isinstance(event, Preempted):
            self._preemptions[request_id] = event.preemptions
            self._seen.pop(request_id, None)
        elif isinstance(event, Retrying | Paused):  # it waits again, its slot freed
            self._seen.pop(request_id, None)
        elif isinstance(event, TERMINAL):
            self._seen.pop(request_id, None)
            self._preemptions.pop(request_id, None)
        elif seen is None:
            return
        elif isinstance(event, Started):
            gpus = slots_of(event)
            resumed = event.resumed_step or 0
            left = (
                seen.job.steps_left
                if seen.job.steps_left is None or seen.step is not None
                else max(0, seen.job.steps_left - resumed)
            )
            self._seen[request_id] = replace(
                seen,
                job=replace(seen.job, gpus=gpus, host=event.host, steps_left=left, on_ray=event.gpus is not None),
                saved=resumed,
            )
        elif isinstance(event, Progress):
            left = max(0, event.total_steps - event.step)
            pace = event.eta_s / left if event.eta_s is not None and left > 0 else seen.job.step_s
            job = replace(seen.job, eta_s=event.eta_s, steps_left=left, step_s=pace)
            self._seen[request_id] = replace(
                seen, job=job, eta_at=at if event.eta_s is not None else None, step=event.step
            )
        elif isinstance(event, Checkpoint):
            self._seen[request_id] = replace(seen, saved=event.step)

    def jobs(self, now: float) -> list[FleetJob]:
        """The running jobs as of `now`: each ETA counted down from when it was given."""
        return [
            replace(
                seen.job,
                eta_s=None
                if seen.job.eta_s is None or seen.eta_at is None
                else max(0.0, seen.job.eta_s - (now - seen.eta_at)),
                steps_since_checkpoint=None if seen.step is None else max(0, seen.step - seen.saved),
            )
            for seen in self._seen.values()
        ]
