from pathlib import Path
from typing import Any

import pytest

from daemon.cli.demo.requests import MATH_ROWS, PROMPT_ROWS
from daemon.settings import Settings
from schemas import Progress, Succeeded
from testbed.client import run_to_end
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import SMALL_TRAINING, assert_adapter_trained, download, example_request, run_handler


@pytest.mark.slow
async def test_grpo_with_shipped_reward_functions(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request(
        "grpo",
        "grpo-e2e",
        dataset={"rows": PROMPT_ROWS},
        # The example's generation shared_settings, shortened for CPU: 4 completions per prompt, 16 tokens each.
        grpo={"num_generations": 4, "max_completion_length": 16, "beta": 0.0},
        training={**SMALL_TRAINING, "per_device_train_batch_size": 4},
    )
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert (done.method, done.trainer) == ("grpo", "trl.GRPOTrainer/trl.GRPOConfig")
    assert_adapter_trained(download(published.endpoint, "results/grpo-e2e", done.commit_sha, tmp_path), tiny_model_dir)


@pytest.mark.slow
async def test_grpo_with_every_trl_reward_by_name_on_a_math_set(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """One request naming every reward function of trl.rewards (and open-r1's tag_count) on the demo's
    sums: TRL calls each by name and logs its mean; the math ones run in the math-verify worker."""
    functions = [
        {"name": "accuracy"},
        {"name": "reasoning_accuracy", "reasoning_delimiters": ["</think>", "is"]},
        {"name": "cosine_scaled", "max_len": 16},
        {"name": "repetition_penalty", "ngram_size": 2, "weight": 0.5},
        {"name": "soft_overlong_punishment", "max_completion_len": 16, "soft_punish_cache": 8},
        {"name": "think_format"},
        {"name": "tag_count"},
    ]
    request = example_request(
        "grpo",
        "grpo-trl-rewards",
        dataset={"rows": MATH_ROWS},
        rewards={"functions": functions},
        grpo={"num_generations": 4, "max_completion_length": 16, "beta": 0.0},
        training={**SMALL_TRAINING, "per_device_train_batch_size": 4, "logging_steps": 1},
    )
    events = await run_to_end(shared_settings, request)
    done = events[-1]
    assert isinstance(done, Succeeded), done
    assert_adapter_trained(
        download(published.endpoint, "results/grpo-trl-rewards", done.commit_sha, tmp_path), tiny_model_dir
    )
    # Each progress event carries the step's mean reward (what the demo's bar shows beside the loss).
    rewards = [event.reward for event in events if isinstance(event, Progress)]
    assert rewards and all(isinstance(reward, float) for reward in rewards), rewards
    log = (shared_settings.jobs_dir / "grpo-trl-rewards" / "child.log").read_text()
    assert [f["name"] for f in functions if f"'rewards/{f['name']}/mean'" not in log] == [], log[-3000:]
    # The tiny model's answers are wrong and run to 16 tokens, past soft_overlong_punishment's 8: both
    # length rewards give their penalties (cosine_scaled: a wrong answer's, between -1 and -0.5).
    assert "'rewards/soft_overlong_punishment/mean': '-" in log and "'rewards/cosine_scaled/mean': '-" in log


# A request no step of which can load: a model and a dataset that do not exist. A handler that got as
# far as loading either would fail with their codes (model_unavailable, dataset_unavailable), not vllm_unavailable.
NOWHERE = {"model": {"id": "/nonexistent/model"}, "dataset": {"url": "/nonexistent/prompts.jsonl"}}


@pytest.mark.parametrize("method", ["grpo", "rloo"])
@pytest.mark.parametrize(
    ("missing", "says"),
    [
        ("vllm", "vLLM is not installed on this host"),
        ("cuda", "no CUDA device"),
    ],
)
def test_use_vllm_fails_in_preflight_before_the_dataset_or_a_model_loads(
    method: str, missing: str, says: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import torch

    from handlers.toolkit import vllm_support

    monkeypatch.setattr(vllm_support, "find_spec", lambda name: None if missing == "vllm" else object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: missing != "cuda")
    request = example_request(
        method, f"{method}-vllm", **NOWHERE, **{method: {"use_vllm": True, "vllm_mode": "colocate"}}
    )
    failure, sent = run_handler(request, tmp_path)
    assert (failure.code, failure.stage, failure.retryable) == ("vllm_unavailable", "preflight", False)
    assert failure.message.startswith(f"{method}.use_vllm: ") and says in failure.message
    other = "no CUDA device" if missing == "vllm" else "vLLM is not installed"
    assert other not in failure.message
    assert [m for m in sent if m["kind"] == "stage"] == []  # never entered load_dataset or load_model


def test_server_mode_without_the_operators_server_fails_in_preflight(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Intake refuses it (daemon.admission.policy); a job spec that reaches a child without
    the server fails all the same."""
    import torch

    from handlers.toolkit import vllm_support

    monkeypatch.setattr(vllm_support, "find_spec", lambda name: object())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    failure, sent = run_handler(
        example_request("grpo", "grpo-server", **NOWHERE, grpo={"use_vllm": True, "vllm_mode": "server"}), tmp_path
    )
    assert (failure.code, failure.stage) == ("vllm_unavailable", "preflight")
    assert "no vLLM server configured on this host (vllm_server_base_url)" in failure.message and sent == []


@pytest.mark.parametrize("method", ["grpo", "rloo"])
def test_vllm_settings_reach_the_trl_config_and_server_mode_the_operators_server(method: str, tmp_path: Path) -> None:
    from trl import GRPOConfig, RLOOConfig

    from handlers.protocol import JobSpec
    from handlers.toolkit.training import trl_config
    from handlers.toolkit.vllm_support import vllm_arguments
    from schemas import REQUEST_MODELS

    config_class = {"grpo": GRPOConfig, "rloo": RLOOConfig}[method]
    operator = "http://vllm.internal:8000"

    def config(block: dict[str, Any], server: str | None) -> Any:
        raw = example_request(method, f"{method}-config", **{method: {"num_generations": 2, **block}})
        request = REQUEST_MODELS[method].model_validate(raw)
        job = JobSpec(
            request=raw,
            checkpoints=tmp_path / "c",
            artifact=tmp_path / "a",
            progress_interval_s=0,
            vllm_server_base_url=server,
        )
        return trl_config(config_class, request, job, method, **vllm_arguments(request, job, method))

    server = config({"use_vllm": True, "vllm_mode": "server"}, operator)
    assert (server.use_vllm, server.vllm_mode, server.vllm_server_base_url) == (True, "server", operator)

    colocate = config(
        {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.5,
            "top_p": 0.9,
            "top_k": 20,
            "min_p": 0.05,
            "repetition_penalty": 1.1,
            "vllm_max_model_length": 1024,
        },
        operator,
    )
    assert (colocate.use_vllm, colocate.vllm_mode, colocate.vllm_server_base_url) == (True, "colocate", None)
    assert (colocate.vllm_gpu_memory_utilization, colocate.top_p, colocate.top_k, colocate.min_p) == (
        0.5,
        0.9,
        20,
        0.05,
    )
    assert (colocate.repetition_penalty, colocate.vllm_max_model_length) == (1.1, 1024)

    assert config({}, operator).use_vllm is False  # TRL's default: generation with the trained model itself
