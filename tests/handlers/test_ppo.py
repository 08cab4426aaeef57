"""PPO runs only where TRL still ships it (trl 1.10 to 1.12.0). `.ci/run` runs this file in the
environment of tests/trl_1_12; on the locked (newest) TRL the daemon rejects ppo instead, which
tests/handlers/test_rejections.py shows."""

import json
import os
from pathlib import Path
from typing import Any

import pytest

from daemon.admission.capabilities import trl_version, unsupported_reason
from daemon.cli.demo.requests import PROMPT_ROWS
from daemon.settings import Settings
from handlers.protocol import JobSpec
from schemas import Progress, Succeeded
from testbed.client import submit, terminal_events
from testbed.data import HUB_TOKEN
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, example_request

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        unsupported_reason("ppo") is not None,
        reason=f"ppo needs trl 1.10-1.12; this environment has trl {trl_version()}",
    ),
]

REWARD_MODEL = "tiny/reward-head"


SMALL_PPO = {"total_episodes": 8, "response_length": 8, "num_ppo_epochs": 1}  # 4 steps of 2 prompts
SMALL_TRAINING = {"per_device_train_batch_size": 2, "learning_rate": 1e-2}


@pytest.fixture(scope="module")
def reward_head_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sequence classifier with one label on the tiny base (as a merged `reward` output would be)."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    folder = tmp_path_factory.mktemp("reward-head")
    AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def reward_model(published: HubServer, reward_head_dir: Path) -> str:
    """The reward head on the local Hub."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=published.endpoint, token=HUB_TOKEN)
    api.create_repo(REWARD_MODEL, exist_ok=True)
    api.upload_folder(folder_path=reward_head_dir, repo_id=REWARD_MODEL)
    return REWARD_MODEL


async def test_ppo_trains_and_its_kl_early_stop_really_stops(
    daemon: DaemonProcess,
    published: HubServer,
    reward_model: str,
    settings: Settings,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    small, training = SMALL_PPO, SMALL_TRAINING
    full = example_request(
        "ppo",
        "ppo-e2e",
        dataset={"rows": PROMPT_ROWS},
        ppo=small,
        training=training,
        reward_model={"id": reward_model},
        kl_early_stop=None,
    )
    stopped = example_request(
        "ppo",
        "ppo-kl-stop",
        dataset={"rows": PROMPT_ROWS},
        ppo=small,
        training=training,
        reward_model={"id": reward_model},
        kl_early_stop={"target_kl": 1e-9},
    )
    await submit(settings, full)
    await submit(settings, stopped)
    events = await terminal_events(settings, {"ppo-e2e", "ppo-kl-stop"})

    done = events["ppo-e2e"][-1]
    assert isinstance(done, Succeeded), done
    assert done.trainer == "trl.experimental.ppo.PPOTrainer/trl.experimental.ppo.PPOConfig"
    assert done.metrics["steps"] == done.metrics["total_steps"] == 4
    # the same final metrics as the other methods, plus PPO's KL figures
    assert {"train_runtime", "first_loss", "final_loss", "world_size", "objective/kl", "objective/scores"} <= set(
        done.metrics
    )
    assert_adapter_trained(download(published.endpoint, "results/ppo-e2e", done.commit_sha, tmp_path), tiny_model_dir)

    early = events["ppo-kl-stop"][-1]
    assert isinstance(early, Succeeded), early
    assert early.metrics["kl_early_stop_step"] == 1 and early.metrics["total_steps"] == 4
    progress = [event for event in events["ppo-kl-stop"] if isinstance(event, Progress)]
    assert progress and progress[-1].step == 1 and progress[-1].total_steps == 4


def run_in_process(job: JobSpec, stop_at_step: int | None = None) -> tuple[Any, list[dict[str, Any]]]:
    """Run the ppo handler in this process, as the child would; a stop is asked for (as SIGTERM asks
    it) right when progress for `stop_at_step` is reported. The handler's result or SystemExit, and
    every message it sent the parent."""
    from handlers.methods.experimental import ppo
    from handlers.protocol import ProgressReport
    from handlers.toolkit.reporting import StatusReporter
    from schemas.request import PPORequest

    class StopAt(StatusReporter):
        def send(self, message: Any) -> None:
            super().send(message)
            if isinstance(message, ProgressReport) and message.step == stop_at_step:
                self.stop_requested = True

    status = job.checkpoints.parent / f"status-{len(list(job.checkpoints.parent.glob('status-*')))}.jsonl"
    reporter = StopAt(os.open(status, os.O_WRONLY | os.O_CREAT))
    reporter.enter("train")  # the runner's SIGTERM handler sets stop_requested only in this stage
    outcome: Any
    try:
        outcome = ppo.train(PPORequest.model_validate(job.request), job, reporter)
    except SystemExit as exit_:
        outcome = exit_
    reporter._stream.close()
    return outcome, [json.loads(line) for line in status.read_text().splitlines()]


def test_ppo_stops_at_a_checkpoint_when_asked_and_the_next_attempt_resumes_there(
    tiny_model_dir: Path, reward_head_dir: Path, tmp_path: Path
) -> None:
    from handlers.methods.experimental.ppo_checkpoints import VALUE_MODEL_FILE
    from handlers.protocol import JobSpec
    from handlers.toolkit.reporting import EXIT_STOPPED

    request = example_request(
        "ppo",
        "ppo-stop",
        model={"id": str(tiny_model_dir)},
        dataset={"rows": PROMPT_ROWS},
        ppo=SMALL_PPO,
        training=SMALL_TRAINING,
        reward_model={"id": str(reward_head_dir)},
        kl_early_stop=None,
    )
    job = JobSpec(
        request=request, checkpoints=tmp_path / "checkpoints", artifact=tmp_path / "artifact", progress_interval_s=0
    )

    stopped, sent = run_in_process(job, stop_at_step=2)
    assert isinstance(stopped, SystemExit) and stopped.code == EXIT_STOPPED
    checkpoint = job.checkpoints / "checkpoint-2"
    assert [m for m in sent if m["kind"] == "stopped"] == [{"kind": "stopped", "step": 2, "path": str(checkpoint)}]
    assert (checkpoint / "adapter_model.safetensors").is_file() and (checkpoint / VALUE_MODEL_FILE).is_file()
    assert (checkpoint / "optimizer.pt").is_file() and not (job.checkpoints / "checkpoint-3").exists()
    assert not job.artifact.exists()

    done, sent = run_in_process(job)
    assert done.trainer == "trl.experimental.ppo.PPOTrainer/trl.experimental.ppo.PPOConfig"
    assert [m["step"] for m in sent if m["kind"] == "first_step"] == [3]
    assert [m["step"] for m in sent if m["kind"] == "progress"] == [3, 4]
    assert done.metrics["resumed_from_step"] == 2 and done.metrics["steps"] == done.metrics["total_steps"] == 4
    # the loss history goes on from the first attempt's: its first loss is step 1's
    assert done.metrics["first_loss"] != done.metrics["final_loss"]
    assert (job.artifact / "adapter_model.safetensors").is_file()
