"""Experiment tracking as an operator configures it: the MLflow tracking server and the TensorBoard
and Trackio folders are the host's (`mlflow_tracking_uri`, `tensorboard_dir`, `trackio_dir`),
`report_to` is allowed by policy, and a job's MLflow run is read back from the real server over its
REST API (its parameters and one loss per step, its id and URL in `succeeded` and the model card),
another job's TensorBoard event files from their folder, and a third's Trackio run with trackio's
own command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import all_succeed, sft_request


def mlflow_get(uri: str, path: str, **query: str) -> Any:
    with urllib.request.urlopen(f"{uri}/api/2.0/mlflow/{path}?{urllib.parse.urlencode(query)}", timeout=10) as answer:
        return json.loads(answer.read())


@pytest.mark.slow
async def test_a_jobs_mlflow_run_is_read_back_from_the_tracking_server(
    published: HubServer, settings: Settings, mlflow_server: str, tmp_path: Path
) -> None:
    tensorboard, trackio = tmp_path / "tensorboard", tmp_path / "trackio"
    settings = settings.model_copy(
        update={
            "allowed_report_to": ["mlflow", "tensorboard", "trackio"],
            "mlflow_tracking_uri": mlflow_server,
            "mlflow_experiment": "adapterd-tests",
            "tensorboard_dir": tensorboard,
            "trackio_dir": trackio,
        }
    )
    training = {"max_steps": 4, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    tracked = sft_request("tracked", training={**training, "report_to": ["mlflow"]})
    requests = {
        "tracked": tracked,
        "tb-tracked": sft_request("tb-tracked", training={**training, "report_to": ["tensorboard"]}),
        "trackio-tracked": sft_request(
            "trackio-tracked", training={**training, "report_to": ["trackio"], "project": "team-a"}
        ),
    }
    untracked_host = settings.model_copy(update={"mlflow_tracking_uri": None})
    daemon = DaemonProcess(settings, tmp_path / "daemon.log").start()
    succeeded = await all_succeed(settings, requests, daemon)
    done = succeeded["tracked"]
    assert isinstance(done, Succeeded), done
    [run] = done.tracking
    assert (
        run.tracker == "mlflow"
        and run.url is not None
        and run.url.startswith(f"{mlflow_server}/#/experiments/")
        and run.run_id in run.url
    )

    found = mlflow_get(mlflow_server, "runs/get", run_id=run.run_id)["run"]
    assert found["info"]["run_name"] == "tracked" and found["info"]["status"] == "FINISHED"
    params = {param["key"]: param["value"] for param in found["data"]["params"]}
    assert params["learning_rate"] == "0.01" and params["max_steps"] == "4"
    history = mlflow_get(mlflow_server, "metrics/get-history", run_id=run.run_id, metric_key="loss")["metrics"]
    assert sorted(point["step"] for point in history) == [1, 2, 3, 4]
    experiment = mlflow_get(mlflow_server, "experiments/get", experiment_id=found["info"]["experiment_id"])[
        "experiment"
    ]
    assert experiment["name"] == "adapterd-tests"

    card = published.commits("results/tracked")[0].files["README.md"].decode()
    assert f"run `{run.run_id}` ({run.url})" in card

    # TensorBoard: the event files in the operator's folder, under the request id, one loss a step.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert [(run.tracker, run.run_id, run.url) for run in succeeded["tb-tracked"].tracking] == [
        ("tensorboard", "tb-tracked", None)
    ]
    events = EventAccumulator(str(tensorboard / "tb-tracked"))
    events.Reload()
    assert [scalar.step for scalar in events.Scalars("train/loss")] == [1, 2, 3, 4]

    # Trackio: the run in the operator's folder, in the request's project, one loss a step, read with
    # the command line an operator would use (`trackio get metric`).
    [run] = succeeded["trackio-tracked"].tracking
    assert (run.tracker, run.run_id, run.project, run.url) == ("trackio", "trackio-tracked", "team-a", None)
    assert (trackio / "team-a.db").is_file()

    def trackio_metric(name: str) -> list[float]:
        shown = subprocess.run(
            [
                str(Path(sys.executable).with_name("trackio")),
                "get",
                "metric",
                "--project",
                "team-a",
                "--run",
                "trackio-tracked",
                "--metric",
                name,
                "--json",
            ],
            env={**os.environ, "TRACKIO_DIR": str(trackio)},
            capture_output=True,
            text=True,
            check=True,
        )
        return [point["value"] for point in sorted(json.loads(shown.stdout)["values"], key=lambda point: point["step"])]

    # trackio numbers its own points; the trainer's step is logged beside each loss (and once more
    # beside the run's summary).
    assert sorted(set(trackio_metric("train/global_step"))) == [1, 2, 3, 4]
    assert len(trackio_metric("train/loss")) == 4
    card = published.commits("results/trackio-tracked")[0].files["README.md"].decode()
    assert "run `trackio-tracked` of project `team-a`" in card

    # A host without a tracking server refuses the same request rather than log to a local folder.
    from daemon.admission.judge import refusal
    from daemon.resources.slots import Slots
    from schemas import decode_request

    refused = refusal(decode_request(json.dumps(tracked).encode()), untracked_host, Slots([], 1))  # type: ignore[arg-type]  # a valid request
    assert (
        refused is not None
        and [e.path for e in refused.errors] == ["training.report_to"]
        and "mlflow_tracking_uri" in refused.errors[0].message
    )
