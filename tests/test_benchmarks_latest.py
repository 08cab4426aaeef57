"""benchmarks/results/latest.md keeps each benchmark's latest table: a run rewrites only the
sections of the benchmarks it ran (benchmarks/latest.py; issue 52)."""

from __future__ import annotations

from pathlib import Path

from benchmarks import latest
from benchmarks.harness import Row, markdown

ROOT = Path(__file__).parents[1]


def table(benchmark: str, value: float, when: str) -> str:
    return markdown([Row(benchmark, "a measure", value, "s")], f"adapterd benchmarks, {when}")


def test_a_run_rewrites_its_own_sections_and_keeps_the_others() -> None:
    first = latest.updated(
        "", {"start": table("start latency", 0.5, "monday"), "intake": table("intake", 9000, "monday")}
    )
    assert list(latest.sections(first)) == ["intake", "start"]  # in the file's order, whatever the run's
    second = latest.updated(
        first, {"start": table("start latency", 0.4, "tuesday"), "queue": table("queue start", 0.3, "tuesday")}
    )
    kept = latest.sections(second)
    assert list(kept) == ["intake", "start", "queue"]
    assert kept["intake"] == table("intake", 9000, "monday")  # not run on tuesday: monday's table, header and all
    assert kept["start"] == table("start latency", 0.4, "tuesday") and "monday" not in kept["start"]
    assert latest.updated(second, {}) == second  # a file read back and written with nothing new is the same file


def test_a_file_from_before_the_sections_is_replaced_by_the_run() -> None:
    old = (
        "adapterd benchmarks, 2026-12-02\n\n| benchmark | measure | value | unit | target | note "
        "|\n|---|---|---|---|---|---|\n"
    )
    assert latest.sections(old) == {}
    assert latest.sections(latest.updated(old, {"start": table("start latency", 0.4, "now")})) == {
        "start": table("start latency", 0.4, "now")
    }


def test_the_kept_file_is_in_sections() -> None:
    text = (ROOT / "benchmarks" / "results" / "latest.md").read_text()
    assert text.startswith(latest.TITLE) and set(latest.sections(text)) <= set(latest.ORDER)
