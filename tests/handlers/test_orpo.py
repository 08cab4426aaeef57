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
async def test_orpo_is_experimental_and_trains(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request("orpo", "orpo-e2e", dataset={"rows": PREFERENCE_ROWS})
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert done.trainer == "trl.experimental.orpo.ORPOTrainer/trl.experimental.orpo.ORPOConfig"
    assert any(
        line.get("event") == "job.experimental_method" and line.get("request_id") == "orpo-e2e"
        for line in shared_daemon.log_lines()
    )
    assert_adapter_trained(download(published.endpoint, "results/orpo-e2e", done.commit_sha, tmp_path), tiny_model_dir)
