"""On-policy distillation through the daemon: the tiny model learns from a teacher of other weights
on the same tokenizer, published on the local Hub; the event names the teacher and its commit."""

from pathlib import Path

import pytest
from huggingface_hub import HfApi

from daemon.cli.demo.requests import PROMPT_ROWS
from daemon.settings import Settings
from handlers.fixtures.tiny_model import save_tiny_model
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.data import HUB_TOKEN
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, example_request, other_model, run_handler

TEACHER = "tiny/qwen2-teacher"


@pytest.mark.slow
async def test_the_student_learns_from_a_hub_teacher_and_the_event_names_its_commit(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    api = HfApi(endpoint=published.endpoint, token=HUB_TOKEN)
    api.create_repo(TEACHER, exist_ok=True)
    commit = api.upload_folder(
        folder_path=save_tiny_model(tmp_path / "teacher", seed=1), repo_id=TEACHER, commit_message="teacher"
    )
    request = example_request(
        "distillation",
        "distill-e2e",
        dataset={"rows": PROMPT_ROWS},
        teacher_model={"id": TEACHER},
        distillation={"beta": 0.5, "max_completion_length": 8},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert done.trainer == "trl.DistillationTrainer/trl.DistillationConfig"
    assert (done.teacher_model, done.teacher_model_revision) == (TEACHER, commit.oid)
    assert (
        done.metrics["first_loss"] > 0
    )  # the teacher's distribution is not the student's: there is something to learn
    assert_adapter_trained(
        download(published.endpoint, "results/distill-e2e", done.commit_sha, tmp_path / "adapter"), tiny_model_dir
    )


def test_a_teacher_without_the_base_tokenizers_tokens_fails_to_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    small = other_model(tiny_model_dir, tmp_path / "small-vocab", vocab_size=64)
    request = example_request(
        "distillation", "distill-vocab", dataset={"rows": PROMPT_ROWS}, teacher_model={"id": str(small)}
    )
    request["model"] = {"id": str(tiny_model_dir)}
    failure, _ = run_handler(request, tmp_path / "job")
    assert (failure.code, failure.stage) == ("model_unavailable", "load_model"), failure
    assert (
        failure.message.startswith(f"teacher_model.id: {small} has 64 token embeddings")
        and "the teacher must share" in failure.message
    )
