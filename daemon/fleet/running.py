"""The jobs running anywhere in the fleet, folded from the events every host reads: what `etas` needs to
say when each waiting request starts, and what the fair share counts as work already under way.
Pure: no Kafka, no clock; the caller feeds each event with `now`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from daemon.fleet.order import Running
from daemon.fleet_config import team_of
from schemas import Accepted, Cancelled, Checkpoint, Event, Failed, Preempted, Progress, Retrying, Started, Succeeded

TERMINAL = (Succeeded, Failed, Cancelled)


@dataclass(frozen=True)
class _Seen:
    """A running job as its events describe it so far."""

    job: Running
    eta_at: float | None = None  # when its last progress event's ETA was given
    step: int | None = None  # its last progress event's step
    saved: int = 0  # the step its last checkpoint holds (or it resumed from)


class RunningJobs:
    """Each request between its `accepted` event and its terminal, `retrying` or `preempted` one: its class,
    team, method, host, start, GPUs (from `started`), the ETA its last `progress` event gave, the steps since
    its last checkpoint, and how often it was preempted. The events do not name the base model nor the steps
    (the model is '' and `Durations.expected` falls back to the method's median, unless this host saw the request
    wait: `known`), nor whether the job may stop now
    (`preemptible` is False: only the host running it preempts it, from its own jobs)."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}
        self._preemptions: dict[str, int] = {}  # request id → times preempted, until its terminal event
        # request id → (model, max_steps) as the request said while it waited (`known`): the events name neither, and
        # without them a job that has sent no progress yet is expected to end as the method's median job does.
        self._requested: dict[str, tuple[str, int | None]] = {}

    def known(self, request_id: str, model: str, steps: int | None) -> None:
        """What a waiting request said of itself, for when it runs (kept until its terminal event)."""
        self._requested[request_id] = (model, steps)

    def observe(self, event: Event, now: float) -> None:
        request_id = event.request_id
        if request_id is None:
            return
        at = min(event.time.timestamp(), now)
        seen = self._seen.get(request_id)
        if isinstance(event, Accepted):
            self._seen[request_id] = _Seen(Running(
                request_id, event.priority_class or "", team_of(event.team), at, event.method, "",
                preemptions=self._preemptions.get(request_id, 0), host=event.host,
            ))
        elif isinstance(event, Preempted):
            self._preemptions[request_id] = event.preemptions
            self._seen.pop(request_id, None)
        elif isinstance(event, Retrying):
            self._seen.pop(request_id, None)
        elif isinstance(event, TERMINAL):
            self._seen.pop(request_id, None)
            self._preemptions.pop(request_id, None)
            self._requested.pop(request_id, None)
        elif seen is None:
            return
        elif isinstance(event, Started):
            gpus = 1 if event.slot == "cpu" else len(event.slot.split(","))
            self._seen[request_id] = replace(seen, job=replace(seen.job, gpus=gpus, host=event.host), saved=event.resumed_step or 0)
        elif isinstance(event, Progress):
            job = replace(seen.job, eta_s=event.eta_s, steps_left=max(0, event.total_steps - event.step))
            self._seen[request_id] = replace(seen, job=job, eta_at=at if event.eta_s is not None else None, step=event.step)
        elif isinstance(event, Checkpoint):
            self._seen[request_id] = replace(seen, saved=event.step)

    def jobs(self, now: float) -> list[Running]:
        """The running jobs as of `now`: each ETA counted down from when it was given; a job with no progress yet has
        the model and steps its request said while it waited (`known`), when this host saw it wait."""
        return [self._now(seen, now) for seen in self._seen.values()]

    def _now(self, seen: _Seen, now: float) -> Running:
        job = seen.job
        model, steps = self._requested.get(job.request_id, (job.model, None))
        steps_left = job.steps_left if job.steps_left is not None else (max(0, steps - seen.saved) if steps else None)
        return replace(
            job, model=job.model or model, steps_left=steps_left,
            eta_s=None if job.eta_s is None or seen.eta_at is None else max(0.0, job.eta_s - (now - seen.eta_at)),
            steps_since_checkpoint=None if seen.step is None else max(0, seen.step - seen.saved),
        )
