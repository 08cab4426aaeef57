"""PPO runs only where TRL still ships it (trl 1.10 to 1.12.0). `.ci/run` runs this file in the
environment of tests/trl_1_12; on the locked (newest) TRL the daemon rejects ppo instead, which
tests/handlers/test_rejections.py shows."""

from pathlib import Path

import pytest

from daemon.capabilities import trl_version, unsupported_reason
from daemon.settings import Settings
from schemas import Progress, Succeeded
from tests.helpers import (
    HUB_TOKEN,
    PROMPT_ROWS,
    assert_adapter_trained,
    download,
    example_request,
    submit,
    terminal_events,
)
from tests.hub_server import HubServer
from tests.processes import DaemonProcess

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(unsupported_reason("ppo") is not None, reason=f"ppo needs trl 1.10-1.12; this environment has trl {trl_version()}"),
]

REWARD_MODEL = "tiny/reward-head"


@pytest.fixture(scope="module")
def reward_model(published: HubServer, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A sequence classifier with one label on the tiny base, on the local Hub (as a merged `reward` output would be)."""
    from huggingface_hub import HfApi
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tmp_path_factory.mktemp("reward-head")
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    api = HfApi(endpoint=published.endpoint, token=HUB_TOKEN)
    api.create_repo(REWARD_MODEL, exist_ok=True)
    api.upload_folder(folder_path=folder, repo_id=REWARD_MODEL)
    return REWARD_MODEL


async def test_ppo_trains_and_its_kl_early_stop_really_stops(
    daemon: DaemonProcess, published: HubServer, reward_model: str, settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    small = {"total_episodes": 8, "response_length": 8, "num_ppo_epochs": 1}
    training = {"per_device_train_batch_size": 2, "learning_rate": 1e-2}
    full = example_request("ppo", "ppo-e2e", dataset={"rows": PROMPT_ROWS}, ppo=small, training=training,
                           reward_model={"id": reward_model}, kl_early_stop=None)
    stopped = example_request("ppo", "ppo-kl-stop", dataset={"rows": PROMPT_ROWS}, ppo=small, training=training,
                              reward_model={"id": reward_model}, kl_early_stop={"target_kl": 1e-9})
    await submit(settings, full)
    await submit(settings, stopped)
    events = await terminal_events(settings, {"ppo-e2e", "ppo-kl-stop"})

    done = events["ppo-e2e"][-1]
    assert isinstance(done, Succeeded), done
    assert done.trainer == "trl.experimental.ppo.PPOTrainer/trl.experimental.ppo.PPOConfig"
    assert done.metrics["steps"] == done.metrics["total_steps"] == 4
    assert_adapter_trained(download(published.endpoint, "results/ppo-e2e", done.commit_sha, tmp_path), tiny_model_dir)

    early = events["ppo-kl-stop"][-1]
    assert isinstance(early, Succeeded), early
    assert early.metrics["kl_early_stop_step"] == 1 and early.metrics["total_steps"] == 4
    progress = [event for event in events["ppo-kl-stop"] if isinstance(event, Progress)]
    assert progress and progress[-1].step == 1 and progress[-1].total_steps == 4
