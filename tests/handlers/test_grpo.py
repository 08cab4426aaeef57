from pathlib import Path

import pytest

from daemon.demo_requests import PROMPT_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from tests.helpers import (
    SMALL_TRAINING,
    assert_adapter_trained,
    download,
    example_request,
    run_to_end,
)
from tests.hub_server import HubServer
from tests.processes import DaemonProcess


@pytest.mark.slow
async def test_grpo_with_shipped_reward_functions(daemon: DaemonProcess, published: HubServer, settings: Settings, tiny_model_dir: Path, tmp_path: Path) -> None:
    request = example_request(
        "grpo", "grpo-e2e",
        dataset={"rows": PROMPT_ROWS},
        # The example's generation settings, shortened for CPU: 4 completions per prompt, 16 tokens each.
        grpo={"num_generations": 4, "max_completion_length": 16, "beta": 0.0},
        training={**SMALL_TRAINING, "per_device_train_batch_size": 4},
    )
    done = (await run_to_end(settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("grpo", "trl.GRPOTrainer/trl.GRPOConfig")
    assert_adapter_trained(download(published.endpoint, "results/grpo-e2e", done.commit_sha, tmp_path), tiny_model_dir)
