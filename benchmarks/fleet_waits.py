"""Two figures of the fleet benchmark (benchmarks/fleet_metrics.py) about what a waiting request is given and
told: `unneeded_preemptions` and `eta_error_current_median`. Pure functions of the events, as the others.

- A preemption is unneeded when, between its request's arrival and the preemption, a slot went to a request
  of a lower class (its `accepted`): that slot could have taken it without stopping anyone. Every slot of the
  benchmark fits every request (alike CPU slots), so any slot given away is one the request fitted.
- A request waits from its arrival (and again from a `preempted` or `retrying` of it) until its next
  `started`. At each moment of such a wait it was last told an ETA by its latest `queued` event in that wait;
  that ETA's error is judged against the start it then had, relative to the wait from when it was told, or
  to MIN_WAIT_S when shorter, as `eta_median_error` judges the first one. The median is time-weighted: an
  ETA a request held for a minute counts sixty times one it held for a second. Moments before a request was
  told anything, or told no ETA, are not judged (the first `queued` comes `queue_wait_event_s` in).
"""

from __future__ import annotations

from collections.abc import Sequence

from benchmarks.fleet_timeline import Arrival, Seen

# An ETA's error is relative to the wait, or to this when the wait was shorter: a near-zero wait would turn any
# ETA into an enormous ratio (both ETA figures judge by it).
MIN_WAIT_S = 1.0
WAITS_AGAIN = frozenset({"preempted", "retrying"})


def unneeded_preemptions(arrivals: Sequence[Arrival], events: Sequence[Seen], classes: Sequence[str]) -> int:
    """Preemptions (their `by` known) for a request while a slot went to a lower class between its
    arrival and the preemption."""
    rank = {name: n for n, name in enumerate(classes)}
    by_id = {arrival.request_id: arrival for arrival in arrivals}
    accepted = [event for event in events if event.type == "accepted" and event.request_id in by_id]
    unneeded = 0
    for event in events:
        taker = by_id.get(event.by or "") if event.type == "preempted" else None
        if taker is None:
            continue
        lower = rank.get(taker.priority_class, len(rank))
        if any(
            taker.at <= other.at <= event.at and rank.get(by_id[other.request_id].priority_class, len(rank)) > lower
            for other in accepted
        ):
            unneeded += 1
    return unneeded


def told_errors(arrivals: Sequence[Arrival], events: Sequence[Seen]) -> list[tuple[float, float]]:
    """(error, seconds it was the one last told) for each ETA a waiting request was told, over every
    wait that ended in a start."""
    ordered = sorted(events, key=lambda e: e.at)
    found: list[tuple[float, float]] = []
    for arrival in arrivals:
        mine = [e for e in ordered if e.request_id == arrival.request_id]
        begins = [arrival.at] + [e.at for e in mine if e.type in WAITS_AGAIN]
        for begin in begins:
            start = next((e.at for e in mine if e.type == "started" and e.at >= begin), None)
            if start is None:
                continue  # a wait that never ended in a start (cancelled, lost): nothing to judge its ETAs against
            told = [e for e in mine if e.type == "queued" and begin <= e.at < start]
            for n, said in enumerate(told):
                until = told[n + 1].at if n + 1 < len(told) else start
                if said.eta_s is None or until <= said.at:
                    continue
                found.append((abs(said.eta_s - (start - said.at)) / max(start - said.at, MIN_WAIT_S), until - said.at))
    return found


def eta_error_current_median(arrivals: Sequence[Arrival], events: Sequence[Seen]) -> float | None:
    """The time-weighted median error of the ETA each waiting request was last told; None when none was told one."""
    errors = sorted(told_errors(arrivals, events))
    total = sum(weight for _, weight in errors)
    if total <= 0:
        return None
    reached = 0.0
    for error, weight in errors:
        reached += weight
        if reached >= total / 2:
            return error
    return errors[-1][0]
