"""The overhead benchmark's stopping rule: pairs go on until the pace ratio's interval is narrow."""

from __future__ import annotations

import random

from benchmarks.overhead import enough_pairs, half_width


def noisy_ratios(count: int, spread: float) -> list[float]:
    rng = random.Random(1)
    return [rng.gauss(1.0, spread) for _ in range(count)]


def test_pairs_stop_once_the_interval_is_narrower_than_the_target() -> None:
    steady = noisy_ratios(40, 0.02)
    assert half_width(steady) < 0.018
    assert enough_pairs(steady, target=0.018, min_pairs=40, check_every=20)


def test_pairs_go_on_while_the_interval_is_wide() -> None:
    noisy = noisy_ratios(40, 0.3)
    assert half_width(noisy) > 0.018
    assert not enough_pairs(noisy, target=0.018, min_pairs=40, check_every=20)


def test_pairs_stop_only_at_a_check_and_never_before_the_minimum() -> None:
    steady = noisy_ratios(60, 0.02)
    assert not enough_pairs(steady[:41], target=0.018, min_pairs=40, check_every=20)
    assert not enough_pairs(steady[:20], target=0.018, min_pairs=40, check_every=20)
    assert enough_pairs(steady, target=0.018, min_pairs=40, check_every=20)
