"""benchmarks/fleet.py: its requests pass the daemons' own admission in both modes, and end to end (slow) it
runs real daemons on the test broker and prints one FLEET line with every figure, nothing lost or trained twice."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pytest

from benchmarks.fleet import BATCH, CONTENTION, URGENT, Plan, fleet_overrides, job_threads, replayed_eta_error, request
from benchmarks.fleet_metrics import parse_fleet_line
from benchmarks.fleet_timeline import Arrival
from daemon.admission.policy import policy_errors
from daemon.settings import Settings
from schemas import Accepted, Event, RequestBase, Started
from schemas.decode import decode_request
from tests.helpers import local_success

ROOT = Path(__file__).parents[1]
KEYS = [
    "urgent_start_p95_s",
    "idle_share",
    "makespan_ratio",
    "fair_share_error",
    "order_share_error",
    "eta_median_error",
    "eta_error_current_median",
    "unneeded_preemptions",
    "preemptions",
    "steps_retrained_per_preemption",
    "lost",
    "duplicate_trainings",
    "duplicate_commits",
    "eta_replay_error",
]


@pytest.mark.parametrize("classes", [False, True], ids=["fifo", "classes"])
def test_the_benchmarks_requests_are_admitted_by_its_daemons_settings(tmp_path: Path, classes: bool) -> None:
    plan = Plan(classes=classes)
    settings = Settings(
        work_dir=tmp_path, allowed_local_model_roots=[tmp_path], metrics_address=None, **fleet_overrides(plan, "x")
    )
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


def test_the_contention_scenario_caps_a_team_and_runs_jobs_longer_than_their_first_seconds_before_preemption(
    tmp_path: Path,
) -> None:
    plan = replace(Plan(), **CONTENTION)
    settings = Settings(
        work_dir=tmp_path, allowed_local_model_roots=[tmp_path], metrics_address=None, **fleet_overrides(plan, "x")
    )
    assert (
        settings.teams["evals"].max_slots == 1
        and settings.teams["oncall"].max_slots == 1
        and settings.teams["sweep"].max_slots is None
    )
    assert settings.preempt_min_run_s == 5.0 and plan.submit and plan.urgent == 2
    # The default scenario keeps its short minimum run and no cap: its table's figures stay comparable.
    assert (
        fleet_overrides(Plan(), "x")["preempt_min_run_s"] == 1.0
        and fleet_overrides(Plan(), "x")["teams"]["evals"].max_slots is None
    )


def test_each_daemon_stands_for_a_host_with_its_share_of_the_cores() -> None:
    # Two daemons' jobs of every core each ran their steps 6x slower beside each other than alone (OpenMP threads
    # oversubscribed), which no host of a real fleet sees: each job gets the cores over the fleet's slots.
    assert job_threads(Plan(daemons=2, slots=1), cores=2) == 1
    assert job_threads(Plan(daemons=2, slots=2), cores=16) == 4
    assert job_threads(Plan(daemons=4, slots=1), cores=2) == 1  # never none
    assert job_threads(Plan(threads=3), cores=2) == 3  # --threads wins


def run_of_one_slot(durations: list[float]) -> tuple[list[Event], list[Arrival]]:
    """Requests that all arrived at 0 and ran one after the other on one slot (no classes on the host)."""
    events: list[Event] = []
    start = 0.0
    for n, seconds in enumerate(durations):
        request_id, end = f"batch-{n}", start + seconds

        def at(t: float) -> datetime:
            return datetime.fromtimestamp(1_800_000_000 + t, UTC)

        events += [
            Accepted(request_id=request_id, method="sft", time=at(start)),
            Started(request_id=request_id, method="sft", slot="cpu", pid=1, time=at(start)),
            local_success(
                request_id,
                time=at(end),
                durations_s={"queue": start, "push": 0.0, "total": end},
                base_model="tiny",
            ),
        ]
        start = end
    return events, [Arrival(f"batch-{n}", 1_800_000_000, BATCH, "sweep") for n in range(len(durations))]


def test_the_run_is_replayed_for_the_etas_error_with_its_own_durations_known() -> None:
    # Alike jobs: with their duration known ahead, every ETA at arrival is the wait it had.
    assert replayed_eta_error(*run_of_one_slot([10.0, 10.0, 10.0]), slots=1) == pytest.approx(0.0)
    # Mixed lengths: the ETA is the median job's (2 s), the waits are 10 and 12 s: errors 0, 0.8 and 8/12.
    assert replayed_eta_error(*run_of_one_slot([10.0, 2.0, 2.0]), slots=1) == pytest.approx(8 / 12)
    assert replayed_eta_error([], [], slots=1) is None


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["classes"])  # the fleet's queue; `--fifo` (today's partitions) runs the same harness
def test_the_fleet_benchmark_runs_end_to_end_and_prints_every_figure(kafka: str, mode: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.fleet", "--quick", "--bootstrap-servers", kafka, f"--{mode}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("FLEET ")]
    assert len(lines) == 1, out.stdout
    figures = parse_fleet_line(lines[0])
    assert set(KEYS) <= set(figures)
    assert figures["lost"] == "0" and figures["duplicate_trainings"] == "0" and figures["duplicate_commits"] == "0"
    assert figures["mode"] == mode and figures["batch"] == "4" and figures["urgent"] == "1"
    for key in ("idle_share", "makespan_ratio"):
        assert float(figures[key]) >= 0
    # The urgent request trained: its start was measured; its class went first (a preemption, or the first free slot).
    assert float(figures["urgent_start_p95_s"]) > 0
    retrained = figures["steps_retrained_per_preemption"]
    assert retrained == "n/a" or float(retrained) <= 1  # a preempted job resumes from the checkpoint its stop saved
