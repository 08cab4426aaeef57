from pathlib import Path

import pytest

from daemon.cli.demo.requests import PREFERENCE_ROWS, PROMPT_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import SMALL_TRAINING, assert_adapter_trained, assert_full_model_trained, download, example_request


@pytest.mark.slow
async def test_rloo_against_the_reward_model_a_reward_request_pushed(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    # First a reward model, merged into full weights (the README's reward example pushes merged).
    reward = example_request("reward", "reward-for-rloo", dataset={"rows": PREFERENCE_ROWS})
    reward_done = (await run_to_end(shared_settings, reward))[-1]
    assert isinstance(reward_done, Succeeded), reward_done
    scorer = download(published.endpoint, "results/reward-for-rloo", reward_done.commit_sha, tmp_path)
    assert_full_model_trained(scorer, tiny_model_dir, sequence_classifier=True)

    # Then RLOO, scoring completions with the regex function and that reward model by repo id.
    request = example_request(
        "rloo",
        "rloo-e2e",
        dataset={"rows": PROMPT_ROWS},
        rloo={"num_generations": 4, "max_completion_length": 16},
        rewards={
            "functions": [{"name": "regex_match", "pattern": "\\d+"}],
            "model": {"id": "results/reward-for-rloo", "revision": reward_done.commit_sha},
        },
        training={**SMALL_TRAINING, "per_device_train_batch_size": 4},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("rloo", "trl.RLOOTrainer/trl.RLOOConfig")
    assert_adapter_trained(download(published.endpoint, "results/rloo-e2e", done.commit_sha, tmp_path), tiny_model_dir)
