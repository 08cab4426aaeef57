"""benchmarks/sharded.py end to end with its quick settings: one process, two ranks data-parallel and two ranks
sharded on the tiny model (CPU), the GPU rows skipped with a line saying why, one SHARDED line with its keys."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
KEYS = {
    "ranks",
    "dp_param_bytes_per_rank",
    "sharded_param_bytes_per_rank",
    "dp_step_s",
    "sharded_step_s",
    "loss_max_rel_diff",
    "one_step_s",
    "dp_peak_bytes_per_rank",
    "sharded_peak_bytes_per_rank",
}


@pytest.mark.slow
def test_the_benchmark_prints_the_three_jobs_side_by_side_and_one_sharded_line() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.sharded", "--quick"],
        cwd=ROOT,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
    ).stdout
    rows = [line for line in out.splitlines() if line.startswith("| cpu |")]
    assert [row.split(" | ")[1] for row in rows] == ["one process", "2 ranks data-parallel", "2 ranks sharded"]
    assert out.count("| cuda |") == 3 and out.count("skipped: no GPU on this host") == 3
    [line] = [line for line in out.splitlines() if line.startswith("SHARDED ")]
    figures = dict(pair.split("=", 1) for pair in line.removeprefix("SHARDED ").split())
    assert KEYS <= set(figures), line
    assert int(figures["ranks"]) == 2 and int(figures["gpus"]) == 0
    # What each rank holds: the tiny model's whole float32 parameters data-parallel, half of them sharded.
    assert int(figures["dp_param_bytes_per_rank"]) == 2 * int(figures["sharded_param_bytes_per_rank"]) == 28_960 * 4
    assert float(figures["dp_step_s"]) > 0 and float(figures["sharded_step_s"]) > 0
    assert (
        float(figures["loss_max_rel_diff"]) < 1e-4
    )  # the same global batch: the same losses (tests/handlers/test_sharding.py)
