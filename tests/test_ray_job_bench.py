"""benchmarks/ray_job.py end to end at its smallest: one run of a 3-step two-worker job on a local Ray cluster the
benchmark starts and stops, one on the local two-rank child, both rows of the table and one RAY_JOB line with its
keys, the two runs' losses the same."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
KEYS = {"workers", "ray_first_step_s", "local_first_step_s", "ray_step_s", "local_step_s", "loss_max_rel_diff"}


@pytest.mark.slow
def test_the_benchmark_prints_ray_and_local_side_by_side_and_one_ray_job_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.ray_job", "--repeats", "1", "--steps", "3"],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    rows = [line.split(" | ")[0].removeprefix("| ") for line in out.splitlines() if line.startswith("| ")]
    assert rows == ["job", "Ray, 2 workers", "local, 2 ranks"], out
    [line] = [line for line in out.splitlines() if line.startswith("RAY_JOB ")]
    figures = dict(pair.split("=", 1) for pair in line.removeprefix("RAY_JOB ").split())
    assert KEYS <= set(figures), line
    assert int(figures["workers"]) == 2
    assert all(float(figures[key]) > 0 for key in KEYS - {"workers", "loss_max_rel_diff"}), line
    # The same ranks, batches and seed on Ray as on the local launcher: the same losses.
    assert float(figures["loss_max_rel_diff"]) < 1e-4, line
