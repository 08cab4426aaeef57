"""Coverage-guided fuzzing of intake's decision in CI, on a bounded budget: tests/atheris_intake.py
(atheris, libFuzzer) for 100,000 inputs from a fixed seed, seeded with the shipped examples and the
corpus of inputs that once broke intake. It fails if any input raises or makes a rejection too
large to publish; libFuzzer prints the input and writes it as `crash-*` in the test's folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FUZZER_PARENT

ROOT = Path(__file__).parents[2]
RUNS = 100_000

pytest.importorskip("atheris")  # a Linux x86-64 wheel: the dev environment has it there


def test_coverage_guided_fuzzing_finds_nothing_that_raises(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        [
            *FUZZER_PARENT,
            sys.executable,
            "-m",
            "tests.atheris_intake",
            f"-runs={RUNS}",
            "-seed=22",
            "-max_len=65536",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
            str(ROOT / "tests" / "corpus" / "hostile"),
            str(ROOT / "schemas" / "examples"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"Done {RUNS} runs" in result.stderr


def test_the_fuzzers_peak_is_its_own_not_the_workers_that_started_it() -> None:
    """libFuzzer's memory limit reads the process's peak resident size, which Linux carries across exec: a child
    exec'd from this (inflated) process starts with its peak; one started through FUZZER_PARENT does not."""
    inflated = bytearray(400 * 2**20)
    inflated[:: 2**12] = b"\x01" * len(inflated[:: 2**12])  # touch every page: resident, not only reserved
    peak = [sys.executable, "-c", "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"]
    direct = int(subprocess.run(peak, capture_output=True, text=True, check=True).stdout) // 1024  # MiB
    fresh = int(subprocess.run([*FUZZER_PARENT, *peak], capture_output=True, text=True, check=True).stdout) // 1024
    assert direct >= 400 > fresh, (direct, fresh)  # the first is this process's peak, the second the child's own
    del inflated
