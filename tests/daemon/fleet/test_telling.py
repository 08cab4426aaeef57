"""When a waiting request is told its place and ETA again (daemon/fleet/policy/telling.py): when they move materially,
at most every RETELL_EVERY_S a request, and at most RETELLS_PER_S a host, the largest moves first. Pure: no broker."""

from __future__ import annotations

from daemon.fleet.policy.order import FleetRequest
from daemon.fleet.policy.telling import (
    RETELL_BURST,
    RETELL_EVERY_S,
    RETELL_HANDOVER_S,
    RETELLS_PER_S,
    Telling,
    Told,
    move,
)

NOW = 1_800_000_000.0


def placed(request_id: str, place: int, eta_s: float | None) -> tuple[FleetRequest, int, float | None]:
    return FleetRequest(request_id, "batch", "a", NOW - 100, "sft", "m"), place, eta_s


def test_a_move_is_news_when_the_expected_start_moved_by_more_than_a_fifth_of_the_wait_and_ten_seconds() -> None:
    told = Told(place=3, eta_s=14.0, at=NOW - 20)  # it was to start at NOW - 6
    assert move(told, 3, 30.0, NOW) is not None  # it will start at NOW + 30: 36 s later than told
    assert move(Told(3, 44.0, NOW - 20), 3, 24.0, NOW) is None  # counted down as it should: the same start
    assert move(Told(3, 44.0, NOW - 20), 3, 28.0, NOW) is None  # 4 s later: under RETELL_MIN_S
    assert move(Told(3, 600.0, NOW - 20), 3, 610.0, NOW) is None  # 30 s later on a wait of 610: 5 %
    assert move(Told(3, 600.0, NOW - 20), 3, 800.0, NOW) is not None  # 220 s later: 28 %
    assert move(Told(3, 600.0, NOW - 20), 3, 300.0, NOW) is not None  # earlier by as much: news too


def test_a_place_moved_back_is_news_even_without_an_eta_and_one_moved_forward_is_not() -> None:
    assert move(Told(1, None, NOW - 20), 2, None, NOW) is not None  # one went ahead of it
    assert move(Told(50, None, NOW - 20), 52, None, NOW) is None  # 4 %
    assert move(Told(5, 100.0, NOW - 20), 2, 80.0, NOW) is None  # forward, as the ETA said
    assert move(Told(5, None, NOW - 20), 5, 80.0, NOW) is not None  # an ETA at last
    assert move(Told(5, 100.0, NOW - 20), 5, None, NOW) is None  # nothing better to say


def test_a_request_is_told_again_at_most_every_retell_every_s_and_one_never_told_at_once() -> None:
    tells = Telling()
    tells.heard("r1", 1, 10.0, NOW - RETELL_EVERY_S / 2, "here")
    assert tells.due([placed("r1", 4, 500.0), placed("r2", 1, 0.0)], NOW, "here") == [placed("r2", 1, 0.0)]
    assert tells.maybe(["r1"], NOW) is False and tells.maybe(["r1"], NOW + RETELL_EVERY_S) is True
    assert tells.due([placed("r1", 4, 500.0)], NOW + RETELL_EVERY_S, "here") == [placed("r1", 4, 500.0)]
    # A telling older than what the request was told last does not undo it (events of two hosts read out of order).
    tells.heard("r1", 4, 500.0, NOW, "here")
    tells.heard("r1", 1, 10.0, NOW - 5, "there")
    assert tells.told["r1"] == Told(4, 500.0, NOW, "here")
    tells.started("r1")  # it has a slot: preempted and waiting again, it is told afresh
    assert "r1" not in tells.told


def test_the_host_that_told_a_request_last_revises_it_and_another_only_once_that_telling_is_old() -> None:
    tells = Telling()
    tells.heard("r1", 1, 10.0, NOW - RETELL_EVERY_S, "announcer")
    assert tells.due([placed("r1", 3, 300.0)], NOW, "dispatcher") == []  # the two need not see the same places
    assert tells.due([placed("r1", 3, 300.0)], NOW, "announcer") == [placed("r1", 3, 300.0)]
    tells.heard("r2", 1, 10.0, NOW - RETELL_HANDOVER_S, "announcer")  # that host is gone, or has stopped announcing
    assert tells.due([placed("r2", 3, 300.0)], NOW, "dispatcher") == [placed("r2", 3, 300.0)]


def test_revisions_are_bounded_per_second_the_largest_moves_first_and_first_tellings_are_not() -> None:
    tells = Telling()
    backlog = 100
    for index in range(backlog):
        tells.heard(f"r{index}", index + 1, 60.0, NOW - 20, "here")  # all told to start at NOW + 40
    moved = [
        placed(f"r{index}", index + 1, 60.0 + 10 * index) for index in range(backlog)
    ]  # r0 keeps its start, r99 moves 1,010 s
    first = tells.due([*moved, placed("new", 101, 2000.0)], NOW, "here")
    assert len(first) == 1 + RETELL_BURST and first[0][0].request_id == "new"
    assert [w.request_id for w, _, _ in first[1:4]] == ["r99", "r98", "r97"]
    assert tells.due(moved, NOW, "here", dry=True) == []  # the burst spent, nothing is left now
    later = tells.due(moved, NOW + 1.0, "here")
    assert len(later) == RETELLS_PER_S and later[0][0].request_id == "r99"  # not told yet: they go on being due
