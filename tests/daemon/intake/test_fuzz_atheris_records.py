"""Coverage-guided fuzzing of whole records through `Intake.take` in CI, on a bounded budget:
tests/atheris_records.py (atheris, libFuzzer) for 3,000 inputs from a fixed seed, replaying first the
checked-in corpus tests/corpus/records/ (records that once broke intake, and seeds at each limit).
It fails if any record escapes intake, ends in other than exactly one outcome, is rejected without
naming its errors or as `internal`, or leaves a DLQ copy too large; libFuzzer prints the input and
writes it as `crash-*` in the test's folder."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import FUZZER_PARENT

ROOT = Path(__file__).parents[3]
CORPUS = ROOT / "tests" / "corpus" / "records"
RUNS = 3_000

pytest.importorskip("atheris")  # a Linux x86-64 wheel: the dev environment has it there


def test_coverage_guided_record_fuzzing_finds_nothing(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    result = subprocess.run(
        [
            *FUZZER_PARENT,
            sys.executable,
            "-m",
            "tests.atheris_records",
            f"-runs={RUNS}",
            "-seed=37",
            "-max_len=4096",
            f"-artifact_prefix={tmp_path}/",
            str(corpus),
            str(CORPUS),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"Done {RUNS} runs" in result.stderr
    seeds = re.search(r"seed corpus: files: (\d+)", result.stderr)
    assert seeds is not None and int(seeds.group(1)) >= len(list(CORPUS.iterdir())) > 0, result.stderr[-4000:]
