"""Coverage-guided fuzzing of intake's decision in CI, on a bounded budget: tests/atheris_intake.py
(atheris, libFuzzer) for 100,000 inputs from a fixed seed, seeded with the shipped examples and the
corpus of inputs that once broke intake. It fails if any input raises or makes a rejection too
large to publish; libFuzzer prints the input and writes it as `crash-*` in the test's folder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
RUNS = 100_000

pytest.importorskip("atheris")  # a Linux x86-64 wheel: the dev environment has it there


def test_coverage_guided_fuzzing_finds_nothing_that_raises(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        [
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
