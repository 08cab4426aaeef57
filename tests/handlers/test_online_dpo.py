"""Online DPO through the daemon: the policy's pairs of answers judged by the shipped reward
functions, from the same registry GRPO's rewards use."""

import json
from pathlib import Path

import pytest

from daemon.cli.demo.requests import PROMPT_ROWS
from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import run_to_end
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_adapter_trained, download, example_request


@pytest.mark.slow
async def test_online_dpo_is_experimental_and_trains_on_pairs_its_rewards_judge(
    shared_daemon: DaemonProcess,
    published: HubServer,
    shared_settings: Settings,
    tiny_model_dir: Path,
    tmp_path: Path,
) -> None:
    request = example_request(
        "online_dpo",
        "online-dpo-e2e",
        dataset={"rows": PROMPT_ROWS},
        online_dpo={"max_new_tokens": 8},
        rewards={"functions": [{"name": "length_penalty", "target_chars": 12}]},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert done.trainer == "trl.experimental.online_dpo.OnlineDPOTrainer/trl.experimental.online_dpo.OnlineDPOConfig"
    assert any(
        line.get("event") == "job.experimental_method" and line.get("request_id") == "online-dpo-e2e"
        for line in shared_daemon.log_lines()
    )
    assert_adapter_trained(
        download(published.endpoint, "results/online-dpo-e2e", done.commit_sha, tmp_path), tiny_model_dir
    )


def test_an_online_dpo_request_with_an_evaluation_is_refused_naming_the_method() -> None:
    from schemas import Rejection, decode_request

    request = example_request(
        "online_dpo",
        "online-dpo-eval",
        dataset={"rows": PROMPT_ROWS, "eval": {"rows": PROMPT_ROWS}},
        evaluation={"gate": [{"metric": "eval_loss", "at_most": 1}]},
    )
    outcome = decode_request(json.dumps(request).encode())
    assert isinstance(outcome, Rejection)
    assert [(e.path, e.message) for e in outcome.errors] == [
        ("evaluation", "method online_dpo has no evaluation in adapterd")
    ]
