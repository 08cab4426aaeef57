"""What the fleet's order is decided from, folded from the events every host already reads: each team's
recent slot-time (`Usage`) and recent job durations (`Durations`). Pure: no Kafka, no clock; the caller
feeds each event with `now`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from typing import Protocol

from daemon.settings.fleet import team_of
from schemas import Accepted, Cancelled, Event, Failed, Paused, Preempted, Retrying, Started, Succeeded

ENDS = (Succeeded, Failed, Cancelled, Retrying, Preempted, Paused)  # the events that free a job's slots


def gpus_of(started: Started) -> int:
    """The GPUs a `started` event's job runs on: a job on Ray its `gpus`; else those its slot names, "cpu" none, "0,1"
    two."""
    if started.gpus is not None:
        return started.gpus
    return 0 if started.slot == "cpu" else len([part for part in started.slot.split(",") if part.strip()])


def slots_of(started: Started) -> int:
    """The slots a `started` event's job takes in the fleet's counts: its GPUs, one on the CPU."""
    return gpus_of(started) or 1


class Usage:
    """Each team's recent slot-time: a job holds its slots from its `accepted` event to its terminal,
    `retrying` or `preempted` event, as many as its `started` event names GPUs (1 until then). Time
    decays with `half_life_s`, so last week's sweep does not hold a team back today; a running job
    counts up to `now`.

    A job interrupted by a daemon stop publishes nothing: it counts as running until its request is
    accepted again (here or on another host), where its first stretch ends."""

    def __init__(self, half_life_s: float = 3600.0) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be above 0, got {half_life_s}")
        self._rate = math.log(2) / half_life_s
        self._done: dict[str, tuple[float, float]] = {}  # team → (decayed slot-seconds, as of this time)
        self._open: dict[str, tuple[str, float, int]] = {}  # request id → (team, since, slots)

    def observe(self, event: Event, now: float) -> None:
        """Fold one event in; those that say nothing of slots are ignored. The event's own time is when it
        happened, bounded by `now` (a host whose clock runs ahead adds no slot-time from the future)."""
        at = min(event.time.timestamp(), now)
        if event.request_id is None:
            return
        if isinstance(event, Accepted):
            self.end(event.request_id, at)
            self.start(event.request_id, team_of(event.team), at)
        elif isinstance(event, Started) and event.request_id in self._open:
            team, _, _ = self._open[event.request_id]
            self.end(event.request_id, at)
            self.start(event.request_id, team, at, slots=slots_of(event))
        elif isinstance(event, ENDS):
            self.end(event.request_id, at)

    def start(self, request_id: str, team: str, at: float, slots: int = 1) -> None:
        """A job of `team` holds `slots` from `at` (the replay calls it directly)."""
        self._open[request_id] = (team, at, slots)

    def end(self, request_id: str, at: float) -> None:
        """The job frees its slots at `at`; nothing for a request that holds none."""
        held = self._open.pop(request_id, None)
        if held is None:
            return
        team, since, slots = held
        value, as_of = self._done.get(team, (0.0, at))
        later = max(as_of, at)
        self._done[team] = (value * self._decay(later - as_of) + slots * self._stretch(since, at, later), later)

    def slot_seconds(self, now: float) -> dict[str, float]:
        """Each team's decayed slot-seconds as of `now`, its running jobs counted up to `now`."""
        seconds = {team: value * self._decay(now - as_of) for team, (value, as_of) in self._done.items()}
        for team, since, slots in self._open.values():
            seconds[team] = seconds.get(team, 0.0) + slots * self._stretch(since, now, now)
        return seconds

    def running(self, mine: Mapping[str, tuple[str, int]] | None = None) -> dict[str, int]:
        """The slots each team's running jobs hold now (for the teams' `max_slots` caps). `mine`: what this host knows
        of its own requests by request id, (team, slots held now), which replaces what the events said of them: a host
        knows at once what it claimed, started, and freed (a job's slots free before its outcome is published, and its
        outcome is read back later still), and a cap read only from the events would give a
        freed slot to a lower class."""
        held: Counter[str] = Counter()
        for request_id, (team, _, slots) in self._open.items():
            if mine is None or request_id not in mine:
                held[team] += slots
        for team, slots in (mine or {}).values():
            if slots:
                held[team] += slots
        return dict(held)

    def _decay(self, seconds: float) -> float:
        return math.exp(-self._rate * seconds)

    def _stretch(self, since: float, until: float, as_of: float) -> float:
        """One slot held from `since` to `until`, decayed to `as_of`: the integral of the decay over the stretch."""
        if until <= since:
            return 0.0
        return (
            self._decay(as_of - until) * -math.expm1(-self._rate * (until - since)) / self._rate
        )  # expm1: exact for a long half-life too


class Durations:
    """Recent durations of successful jobs: the seconds each held its slot (its `total` less its queue
    and push), the last `window` of each method and model. A duplicate answered from an earlier
    success trained nothing and is left out; a job resumed from a checkpoint counts its last attempt only."""

    def __init__(self, window: int = 50) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        self._by_model: dict[tuple[str, str], deque[float]] = {}
        self._by_method: dict[str, deque[float]] = {}
        self._all: deque[float] = deque(maxlen=window)
        self._expected: dict[
            tuple[str, str], float | None
        ] = {}  # answers since the last add: the order asks once per request
        # With the steps it trained (its `metrics`: train_runtime x train_steps_per_second): the seconds it held its
        # slot outside training, and a step's seconds, so a request of another length is expected at its own.
        self._steps_by_model: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._steps_by_method: dict[str, deque[tuple[float, float]]] = {}
        self._steps_all: deque[tuple[float, float]] = deque(maxlen=window)
        self._paces: dict[tuple[str, str], tuple[float, float] | None] = {}  # the medians of those, since the last add

    def observe(self, event: Event, now: float) -> None:
        """Fold one event in: a `succeeded` one with its durations; every other is ignored. (`now` is unused:
        a duration is as good a week later; the window keeps them recent.)"""
        if not isinstance(event, Succeeded) or event.duplicate or "total" not in event.durations_s:
            return
        times = event.durations_s
        held = max(0.0, times["total"] - times.get("queue", 0.0) - times.get("push", 0.0))
        runtime, steps = event.metrics.get("train_runtime"), trained_steps(event.metrics)
        # A step's pace is the steady one (`median_step_s`, the first step's set-up left out) where the job said it:
        # a short job's runtime over its steps counts its set-up in every step, and a long one is then expected at
        # twice its length. The set-up goes with the time outside training.
        pace = event.metrics.get("median_step_s")
        training = pace * steps if steps and pace and pace > 0 else runtime
        self.add(event.method, event.base_model, held, steps=steps, training_s=training)

    def add_steps(self, method: str, model: str, outside_s: float, step_s: float) -> None:
        sample = (max(0.0, outside_s), max(0.0, step_s))
        self._steps_by_model.setdefault((method, model), deque(maxlen=self.window)).append(sample)
        self._steps_by_method.setdefault(method, deque(maxlen=self.window)).append(sample)
        self._steps_all.append(sample)
        self._paces.clear()

    def add(
        self, method: str, model: str, seconds: float, *, steps: float | None = None, training_s: float | None = None
    ) -> None:
        if steps and training_s is not None and steps >= 1:
            self.add_steps(method, model, seconds - training_s, training_s / steps)
        self._by_model.setdefault((method, model), deque(maxlen=self.window)).append(seconds)
        self._by_method.setdefault(method, deque(maxlen=self.window)).append(seconds)
        self._all.append(seconds)
        self._expected.clear()

    def _samples(self, method: str, model: str) -> deque[tuple[float, float]] | None:
        """The (outside training, step) samples of the same method and model, else method, else all; None: none."""
        return next(
            (
                known
                for known in (
                    self._steps_by_model.get((method, model)),
                    self._steps_by_method.get(method),
                    self._steps_all,
                )
                if known
            ),
            None,
        )

    def _step_samples(self, method: str, model: str) -> list[float]:
        return [t for _, t in self._samples(method, model) or ()]

    def _pace(self, method: str, model: str) -> tuple[float, float] | None:
        """The median seconds outside training and of one step (`_samples`); worked out once per method and model
        between adds (the order asks for every waiting request, every turn)."""
        if (method, model) not in self._paces:
            samples = self._samples(method, model)
            self._paces[(method, model)] = (
                (statistics.median(o for o, _ in samples), statistics.median(t for _, t in samples))
                if samples
                else None
            )
        return self._paces[(method, model)]

    def step_s(self, method: str, model: str, running: Sequence[float] = ()) -> float | None:
        """The median seconds of one training step of the same method and model, else method, else all; None unknown.
        With `running` (the paces the running jobs of the same method and model have now) taken into the median."""
        if running:
            return statistics.median([*self._step_samples(method, model), *running])
        pace = self._pace(method, model)
        return pace[1] if pace is not None else None

    def expected(
        self, method: str, model: str, steps: int | None = None, running: Sequence[float] = ()
    ) -> float | None:
        """The median of the same method and model, else of the same method, else of all, else None. Given the
        request's `steps` (its max_steps) and jobs whose steps are known: their median time outside training
        plus their median step's time, times `steps`; the step's median taken with `running`, the paces the
        running jobs of the same method and model have now (they say what the hosts do today: with few jobs
        finished, a few short ones' steps said nothing of a sweep's)."""
        pace = self._pace(method, model) if steps else None
        if steps and pace is not None:
            step = self.step_s(method, model, running)  # never None here: the samples `pace` came from are there
            return pace[0] + (pace[1] if step is None else step) * steps
        if (method, model) not in self._expected:
            found = next(
                (
                    known
                    for known in (self._by_model.get((method, model)), self._by_method.get(method), self._all)
                    if known
                ),
                None,
            )
            self._expected[(method, model)] = statistics.median(found) if found else None
        return self._expected[(method, model)]


class Pace(Protocol):
    """What the fleet's order reads of the durations: a step's pace, and a job's expected seconds (`Durations`, or
    `Paced`: the same taken with the running jobs' paces)."""

    def step_s(self, method: str, model: str) -> float | None: ...

    def expected(self, method: str, model: str, steps: int | None = None) -> float | None: ...


class Paced:
    """`Durations` read with the paces the running jobs have now (`running`: each one's seconds a step from its last
    progress, by method and model), so that the ETAs, the fair share's work, the preemption's model and a running
    job's time left read a step's pace one way: with few jobs finished, a few short ones' steps said nothing of a
    sweep's, and the running jobs say what the hosts do today."""

    def __init__(self, durations: Durations, running: Mapping[tuple[str, str], Sequence[float]]) -> None:
        self.durations = durations
        self.running = running

    def step_s(self, method: str, model: str) -> float | None:
        return self.durations.step_s(method, model, self.running.get((method, model), ()))

    def expected(self, method: str, model: str, steps: int | None = None) -> float | None:
        return self.durations.expected(method, model, steps, running=self.running.get((method, model), ()))


def trained_steps(metrics: Mapping[str, float]) -> float | None:
    """The steps a job trained, from its `succeeded` metrics (train_runtime x train_steps_per_second); None unsaid."""
    runtime, rate = metrics.get("train_runtime"), metrics.get("train_steps_per_second")
    return runtime * rate if runtime and rate and runtime > 0 and rate > 0 else None


class Switches:
    """How long a preemption's switch takes, measured from the events: for each `preempted` event, the seconds from
    it to the `started` event of the request that took the slot (`by`); the median of the last `window`, else 0.

    The `preempted` event is published once the stopped job has saved its checkpoint and ended, so this is the part
    after the drain: the claim read, its `accepted`, the child started. The drain before it (the victim's checkpoint,
    bounded by `drain_timeout_s`) is not timed by any event and is not counted: a stop at a step that saves nothing
    takes a second or two, and a bound of a minute would make every preempting request's ETA a minute late."""

    def __init__(self, window: int = 20) -> None:
        self._stopped: dict[
            str, float
        ] = {}  # the preempting request's id → when its victim's `preempted` event said it stopped
        self._seconds: deque[float] = deque(maxlen=window)

    def observe(self, event: Event, now: float) -> None:
        if isinstance(event, Preempted):
            self._stopped[event.by] = event.time.timestamp()
        elif isinstance(event, Started) and event.request_id in self._stopped:
            self._seconds.append(max(0.0, event.time.timestamp() - self._stopped.pop(event.request_id)))

    def seconds(self) -> float:
        return statistics.median(self._seconds) if self._seconds else 0.0
