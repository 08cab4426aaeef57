from pathlib import Path

import pytest

from daemon.cli.demo.requests import PREFERENCE_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, example_request


@pytest.mark.slow
async def test_cpo_is_experimental_trains_and_its_loss_type_reaches_trl(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    first_losses = {}
    for loss_type in ("sigmoid", "simpo"):
        request_id = f"cpo-e2e-{loss_type}"
        request = example_request(
            "cpo", request_id, dataset={"rows": PREFERENCE_ROWS}, cpo={"beta": 0.1, "loss_type": loss_type}
        )
        done = (await run_to_end(shared_settings, request))[-1]
        assert isinstance(done, Succeeded), done
        assert done.trainer == "trl.experimental.cpo.CPOTrainer/trl.experimental.cpo.CPOConfig"
        assert any(
            line.get("event") == "job.experimental_method" and line.get("request_id") == request_id
            for line in shared_daemon.log_lines()
        )
        assert_adapter_trained(
            download(published.endpoint, f"results/{request_id}", done.commit_sha, tmp_path / loss_type), tiny_model_dir
        )
        first_losses[loss_type] = done.metrics["first_loss"]
    # The same rows, seed and start under two losses: the first step's loss tells them apart.
    assert first_losses["sigmoid"] != pytest.approx(first_losses["simpo"], rel=1e-3), first_losses
