from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from tests.helpers import (
    PREFERENCE_DATASET,
    SMALL_TRAINING,
    assert_adapter_trained,
    download,
    example_request,
    run_to_end,
)
from tests.hub_server import HubServer
from tests.processes import DaemonProcess


@pytest.mark.slow
async def test_dpo_on_a_hub_dataset_with_mapped_columns_and_an_eval_split(
    daemon: DaemonProcess, published: HubServer, settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request(
        "dpo", "dpo-e2e",
        dataset={
            "id": PREFERENCE_DATASET, "columns": {"question": "prompt", "good": "chosen", "bad": "rejected"},
            "eval_split": "test", "max_samples": 3,
        },
        training={**SMALL_TRAINING, "eval_strategy": "steps", "eval_steps": 2},
    )
    done = (await run_to_end(settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("dpo", "trl.DPOTrainer/trl.DPOConfig")
    commit = published.commits("results/dpo-e2e")[0]
    assert "- dpo" in commit.files["README.md"].decode()
    assert_adapter_trained(download(published.endpoint, "results/dpo-e2e", done.commit_sha, tmp_path), tiny_model_dir)
