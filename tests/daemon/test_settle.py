"""`next_try`: the attempt and due time a `retrying` job's request is sent back with (daemon/jobs/settle.py).
The whole path (the retry copy, its signed headers, the commit) is driven in test_scheduler_core.py and
test_packing.py; these pin the decision alone."""

from __future__ import annotations

from daemon.jobs.settle import NextTry, next_try
from daemon.kafka.retry_state import MAX_BACKOFF_S

NOW = 1_000_000.0


def test_a_retryable_failure_is_the_next_attempt_after_a_doubling_backoff() -> None:
    assert next_try("hub_unavailable", 1, False, 30.0, NOW) == NextTry(2, NOW + 30.0, alone=False)
    assert next_try("hub_unavailable", 2, False, 30.0, NOW) == NextTry(3, NOW + 60.0, alone=False)
    assert next_try("hub_unavailable", 3, True, 30.0, NOW) == NextTry(4, NOW + 120.0, alone=False)


def test_the_backoff_is_capped() -> None:
    assert next_try("stalled", 30, False, 30.0, NOW).due == NOW + MAX_BACKOFF_S


def test_out_of_memory_on_a_shared_gpu_is_the_same_attempt_now_alone() -> None:
    assert next_try("out_of_memory", 2, True, 30.0, NOW) == NextTry(2, NOW, alone=True)


def test_out_of_memory_on_a_gpu_of_its_own_is_its_own_failure() -> None:
    assert next_try("out_of_memory", 2, False, 30.0, NOW) == NextTry(3, NOW + 60.0, alone=False)
