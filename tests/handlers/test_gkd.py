"""GKD through the daemon: the tiny model learns from a teacher of other weights on the same
tokenizer, on the rows' answers and on its own (`lmbda`); the event names the teacher."""

from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, example_request, other_model


@pytest.mark.slow
async def test_gkd_is_experimental_and_learns_from_a_local_teacher(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
    tiny_model_dir: Path,
) -> None:
    # A local teacher, under the shared daemon's allowed_local_model_roots (its work folder's parent).
    teacher = other_model(tiny_model_dir, shared_settings.work_dir.parent / "gkd-teacher")
    request = example_request(
        "gkd",
        "gkd-e2e",
        dataset={"rows": CHAT_ROWS},
        teacher_model={"id": str(teacher)},
        gkd={"lmbda": 0.5, "beta": 0.5, "max_new_tokens": 8},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert done.trainer == "trl.experimental.gkd.GKDTrainer/trl.experimental.gkd.GKDConfig"
    assert (done.teacher_model, done.teacher_model_revision) == (str(teacher), None)  # a local folder has no commit
    assert any(
        line.get("event") == "job.experimental_method" and line.get("request_id") == "gkd-e2e"
        for line in shared_daemon.log_lines()
    )
    assert done.metrics["first_loss"] > 0
    assert_adapter_trained(
        download(
            published.endpoint, "results/gkd-e2e", done.commit_sha, shared_settings.work_dir.parent / "gkd-adapter"
        ),
        tiny_model_dir,
    )
