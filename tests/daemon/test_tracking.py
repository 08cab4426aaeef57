"""Experiment tracking as an operator configures it: the MLflow tracking server is the host's
(`mlflow_tracking_uri`), `report_to: ["mlflow"]` is allowed by policy, and a job's run is read back
from the real server over its REST API: its parameters and one loss per step, and its id and URL
in `succeeded` and the model card."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from tests.helpers import sft_request, submit, terminal_events
from tests.hub_server import HubServer
from tests.processes import DaemonProcess


def mlflow_get(uri: str, path: str, **query: str) -> Any:
    with urllib.request.urlopen(f"{uri}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}", timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.slow
async def test_a_jobs_mlflow_run_is_read_back_from_the_tracking_server(published: HubServer, settings: Settings, mlflow_server: str, tmp_path: Path) -> None:
    settings = settings.model_copy(update={"allowed_report_to": ["mlflow"], "mlflow_tracking_uri": mlflow_server, "mlflow_experiment": "adapterd-tests"})
    tracked = sft_request("tracked", training={"max_steps": 4, "learning_rate": 1e-2, "per_device_train_batch_size": 2, "report_to": ["mlflow"]})
    untracked_host = settings.model_copy(update={"mlflow_tracking_uri": None})
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    try:
        await submit(settings, tracked)
        events = (await terminal_events(settings, {"tracked"}))["tracked"]
    finally:
        daemon.stop()
    done = events[-1]
    assert isinstance(done, Succeeded), done
    [run] = done.tracking
    assert run.tracker == "mlflow" and run.url is not None and run.url.startswith(f"{mlflow_server}/#/experiments/") and run.run_id in run.url

    found = mlflow_get(mlflow_server, "runs/get", run_id=run.run_id)["run"]
    assert found["info"]["run_name"] == "tracked" and found["info"]["status"] == "FINISHED"
    params = {param["key"]: param["value"] for param in found["data"]["params"]}
    assert params["learning_rate"] == "0.01" and params["max_steps"] == "4"
    history = mlflow_get(mlflow_server, "metrics/get-history", run_id=run.run_id, metric_key="loss")["metrics"]
    assert sorted(point["step"] for point in history) == [1, 2, 3, 4]
    experiment = mlflow_get(mlflow_server, "experiments/get", experiment_id=found["info"]["experiment_id"])["experiment"]
    assert experiment["name"] == "adapterd-tests"

    card = published.commits("results/tracked")[0].files["README.md"].decode()
    assert f"run `{run.run_id}` ({run.url})" in card

    # A host without a tracking server refuses the same request rather than log to a local folder.
    from daemon.intake import Intake
    from daemon.slots import Slots
    from schemas import decode_request

    refusal = Intake(untracked_host, None, None, None, Slots([], 1)).refusal(decode_request(json.dumps(tracked).encode()))  # type: ignore[arg-type]
    assert refusal is not None and [e.path for e in refusal.errors] == ["training.report_to"] and "mlflow_tracking_uri" in refusal.errors[0].message
