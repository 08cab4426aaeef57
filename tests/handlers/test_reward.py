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
async def test_reward_model_adapter_loads_as_a_sequence_classifier(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request(
        "reward",
        "reward-e2e",
        dataset={"rows": PREFERENCE_ROWS},
        output={"repo_id": "results/reward-e2e", "push": "adapter"},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("reward", "trl.RewardTrainer/trl.RewardConfig")
    adapter = download(published.endpoint, "results/reward-e2e", done.commit_sha, tmp_path)
    assert_adapter_trained(adapter, tiny_model_dir, sequence_classifier=True)
