"""benchmarks/fleet.py: its requests pass the daemons' own admission in both modes, and end to end (slow) it
runs real daemons on the test broker and prints one FLEET line with every figure, nothing lost or trained twice."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fleet import BATCH, URGENT, Plan, fleet_overrides, request
from benchmarks.fleet_metrics import parse_fleet_line
from daemon.admission.policy import policy_errors
from daemon.settings import Settings
from schemas import RequestBase
from schemas.decode import decode_request

ROOT = Path(__file__).parents[1]
KEYS = ["urgent_start_p95_s", "idle_share", "makespan_ratio", "fair_share_error", "eta_median_error", "preemptions",
        "steps_retrained_per_preemption", "lost", "duplicate_trainings", "duplicate_commits", "eta_replay_error"]


@pytest.mark.parametrize("classes", [False, True], ids=["fifo", "classes"])
def test_the_benchmarks_requests_are_admitted_by_its_daemons_settings(tmp_path: Path, classes: bool) -> None:
    plan = Plan(classes=classes)
    settings = Settings(work_dir=tmp_path, allowed_local_model_roots=[tmp_path], metrics_address=None, **fleet_overrides(plan, "x"))
    for name in (BATCH, URGENT):
        body = request(plan, str(tmp_path / "model"), f"{name}-0", 3, name, "team")
        decoded = decode_request(json.dumps(body).encode(), body["request_id"].encode())
        assert isinstance(decoded, RequestBase), decoded
        assert policy_errors(decoded, settings) == []
        # Without classes a request names none (a host with none rejects one that does); with them, its own.
        assert decoded.priority_class == (name if classes else None)
    if classes:
        assert settings.class_topics[URGENT] != settings.class_topics[BATCH]
        assert [c.name for c in settings.priority_classes if c.preemptible] == [BATCH]
        assert settings.preempt_min_run_s < 5


@pytest.mark.slow
def test_the_fleet_benchmark_runs_end_to_end_and_prints_every_figure(kafka: str) -> None:
    out = subprocess.run([sys.executable, "-m", "benchmarks.fleet", "--quick", "--bootstrap-servers", kafka],
                         capture_output=True, text=True, cwd=ROOT, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("FLEET ")]
    assert len(lines) == 1, out.stdout
    figures = parse_fleet_line(lines[0])
    assert set(KEYS) <= set(figures)
    assert figures["lost"] == "0" and figures["duplicate_trainings"] == "0" and figures["duplicate_commits"] == "0"
    assert figures["mode"] == "fifo" and figures["batch"] == "4" and figures["urgent"] == "1"
    for key in ("idle_share", "makespan_ratio"):
        assert float(figures[key]) >= 0
    # The urgent request trained: its start was measured.
    assert float(figures["urgent_start_p95_s"]) > 0
