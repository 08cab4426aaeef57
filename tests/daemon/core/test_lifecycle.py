"""The job state machine itself (daemon/job/lifecycle.py): every state has its transitions, final states
have none, a move it does not have is refused, and the stop rules (an interrupt overrides a cancel,
a cancel is too late once the push began)."""

from __future__ import annotations

import pytest

from daemon.job.lifecycle import FINAL, OUTCOMES, TRANSITIONS, IllegalTransition, Lifecycle, State, Stop


def reachable(start: State) -> set[State]:
    seen, todo = {start}, [start]
    while todo:
        for target in TRANSITIONS[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_every_state_is_reached_from_queued_and_every_live_state_can_end() -> None:
    assert set(TRANSITIONS) == set(State) and reachable(State.QUEUED) == set(State)  # no state the code cannot enter
    assert all(reachable(state) & FINAL for state in State)  # no live state without a way out
    assert all(not TRANSITIONS[state] for state in FINAL)
    assert all(
        State.INTERRUPTED in TRANSITIONS[state] for state in set(State) - FINAL
    )  # any live job can be interrupted
    assert State.CANCELLED not in TRANSITIONS[State.PUSHING] and State.SUCCEEDED not in TRANSITIONS[State.TRAINING]


def test_each_published_outcome_is_the_event_type_the_job_enters_it_by() -> None:
    """JobRunner.run enters `State(event.type)` once the event is acknowledged: each outcome is an
    event type, and INTERRUPTED, which publishes nothing, is none."""
    from typing import get_args

    from schemas.events import Cancelled, Failed, Retrying, Succeeded

    types = {get_args(kind.model_fields["type"].annotation)[0] for kind in (Succeeded, Failed, Retrying, Cancelled)}
    assert {state.value for state in OUTCOMES} == types and State.INTERRUPTED.value not in types


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ([State.TRAINING, State.PUSHING, State.SUCCEEDED], True),
        ([State.PUSHING, State.SUCCEEDED], True),  # an earlier attempt's artifact: pushed, not trained again
        ([State.SUCCEEDED], True),  # a duplicate
        ([State.TRAINING, State.SUCCEEDED], False),  # success is pushed first
        ([State.TRAINING, State.PUSHING, State.CANCELLED], False),  # too late to cancel
        ([State.SUCCEEDED, State.FAILED], False),  # one outcome per job
    ],
)
def test_only_the_drawn_moves_are_allowed(path: list[State], allowed: bool) -> None:
    lifecycle = Lifecycle()
    try:
        for state in path:
            lifecycle.to(state)
    except IllegalTransition:
        assert not allowed, path
    else:
        assert allowed, path
        assert lifecycle.history == [State.QUEUED, *path] and lifecycle.published == (path[-1] in OUTCOMES)


def test_an_interrupt_overrides_a_cancel_and_a_cancel_comes_too_late_once_pushing() -> None:
    lifecycle = Lifecycle()
    cancel, interrupt = Stop("cancel", "asked"), Stop("interrupt", "daemon stopping")
    assert lifecycle.request_stop(cancel) and lifecycle.stop == cancel
    assert lifecycle.request_stop(interrupt) and lifecycle.stop == interrupt
    assert lifecycle.request_stop(cancel) and lifecycle.stop == interrupt  # never the reverse
    pushing = Lifecycle()
    pushing.to(State.PUSHING)
    assert not pushing.request_stop(cancel) and pushing.stop is None
    assert pushing.request_stop(interrupt)
    done = Lifecycle()
    done.to(State.SUCCEEDED)
    assert not done.request_stop(interrupt)


def test_the_drawing_in_docs_architecture_md_is_transitions() -> None:
    """The one drawing of the lifecycle is generated from TRANSITIONS (`python -m daemon.job.lifecycle_doc`)."""
    from pathlib import Path

    from daemon.job.lifecycle_doc import DIAGRAM_END, DIAGRAM_START, diagram

    text = (Path(__file__).parents[3] / "docs" / "architecture.md").read_text()
    drawn = text[text.index(DIAGRAM_START) : text.index(DIAGRAM_END) + len(DIAGRAM_END)]
    assert drawn == diagram(), (
        "docs/architecture.md's lifecycle drifted from TRANSITIONS: run `python -m daemon.job.lifecycle_doc`"
    )
    edges = {tuple(line.strip().split(" --> ")) for line in drawn.splitlines() if " --> " in line and "[*]" not in line}
    assert edges == {(state.name, target.name) for state, targets in TRANSITIONS.items() for target in targets}
