"""A job's lifecycle as one state machine: its states, the transitions between them, and the one
request that stops a job early. docs/architecture.md draws it, generated from TRANSITIONS
(`python -m daemon.job.lifecycle_doc`; a test fails on drift).

JUDGING is the gate (daemon/job/gate.py): the request's rules against the numbers the child measured
after training; it decides where the artifact goes, and a failed gate is still SUCCEEDED (pushed to a
pull request or a side branch, or nowhere). QUEUED also goes straight to PUSHING or JUDGING (an earlier
attempt's artifact is complete on disk: nothing is trained twice) and to SUCCEEDED (the request already succeeded:
answered as a duplicate). A final state is entered once its event is acknowledged; then only the commit is left.

A job ends early only by a `Stop`, through `JobRunner.stop` (daemon/job/runner.py): a cancel (it ends
CANCELLED), a timeout or a stall (FAILED or RETRYING, named so), each with its child killed at once;
or an interrupt (a daemon stop, a partition that moved, a preemption or a pause: its child saves a checkpoint
within the grace, nothing is published by the job, and the request is read again; a preempted or paused one is
put back to wait by whoever stopped it, daemon/fleet/claimed.py, daemon/jobs/holds.py). An interrupt overrides any stop;
no other replaces the first; none is taken once the push has begun, but an interrupt.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from schemas.common import AdapterdError


class State(StrEnum):
    QUEUED = "queued"
    TRAINING = "training"
    JUDGING = "judging"
    PUSHING = "pushing"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    RETRYING = "retrying"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"


OUTCOMES = frozenset({State.SUCCEEDED, State.FAILED, State.RETRYING, State.CANCELLED})  # published: commit it
FINAL = OUTCOMES | {State.INTERRUPTED}

TRANSITIONS: dict[State, frozenset[State]] = {
    State.QUEUED: frozenset(
        {
            State.TRAINING,
            State.JUDGING,
            State.PUSHING,
            State.SUCCEEDED,
            State.FAILED,
            State.RETRYING,
            State.CANCELLED,
            State.INTERRUPTED,
        }
    ),
    State.TRAINING: frozenset(
        {State.JUDGING, State.PUSHING, State.FAILED, State.RETRYING, State.CANCELLED, State.INTERRUPTED}
    ),
    State.JUDGING: frozenset({State.PUSHING, State.SUCCEEDED, State.FAILED, State.CANCELLED, State.INTERRUPTED}),
    State.PUSHING: frozenset({State.SUCCEEDED, State.FAILED, State.RETRYING, State.INTERRUPTED}),
    **{state: frozenset() for state in FINAL},
}


class IllegalTransition(AdapterdError, RuntimeError):
    """A move the lifecycle does not have: a bug of adapterd's, never a request's."""


StopKind = Literal["cancel", "timeout", "stalled", "interrupt"]


@dataclass(frozen=True)
class Stop:
    """Why a job is stopped before its own outcome, and how long its child may take to save a
    checkpoint first (`grace_s`: SIGTERM, then SIGKILL; 0 kills at once). `cancel` ends it in
    `cancelled`; `timeout` and `stalled` in `failed` or `retrying` with that code and `reason` as
    its message; `interrupt` publishes nothing (the request is read again)."""

    kind: StopKind
    reason: str
    grace_s: float = 0.0

    @classmethod
    def interrupt(cls, reason: str, grace_s: float) -> Stop:
        return cls("interrupt", reason, grace_s)


class Lifecycle:
    """The state of one job, moved only along TRANSITIONS."""

    def __init__(self) -> None:
        self.state = State.QUEUED
        self.history = [State.QUEUED]
        self.stop: Stop | None = None

    def to(self, state: State) -> None:
        if state not in TRANSITIONS[self.state]:
            raise IllegalTransition(f"a job cannot go from {self.state} to {state}")
        self.state = state
        self.history.append(state)

    def request_stop(self, stop: Stop) -> bool:
        """Record why the job stops; False when it is too late (any stop but an interrupt once the
        push began, any stop once the job is final). An interrupt replaces any stop asked for before
        it; no other replaces the first."""
        if self.state in FINAL or (stop.kind != "interrupt" and self.state is State.PUSHING):
            return False
        if stop.kind == "interrupt" or self.stop is None:
            self.stop = stop
        return True

    @property
    def published(self) -> bool:
        """Its outcome is published: only the commit is left."""
        return self.state in OUTCOMES
