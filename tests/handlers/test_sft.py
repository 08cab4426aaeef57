from pathlib import Path

import pytest

from daemon.settings import Settings
from schemas import Failed, Succeeded
from testbed.client import run_to_end
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import assert_full_model_trained, download, example_request


@pytest.mark.slow
async def test_full_fine_tune_pushes_weights_that_load_without_peft(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings, tiny_model_dir: Path, tmp_path: Path
) -> None:
    request = example_request("sft", "sft-full", dataset={"rows": CHAT_ROWS}, peft=None, sft={"max_length": 64})
    done = (await run_to_end(shared_settings, request))[-1]
    assert isinstance(done, Succeeded), done
    assert "model.safetensors" in done.files and "adapter_config.json" not in done.files
    card = published.commits("results/sft-full")[0].files["README.md"].decode()
    assert "library_name: transformers" in card and "full-fine-tune" in card
    assert_full_model_trained(
        download(published.endpoint, "results/sft-full", done.commit_sha, tmp_path), tiny_model_dir
    )


@pytest.mark.slow
async def test_qlora_without_cuda_fails_in_preflight_before_training(
    shared_daemon: DaemonProcess, published: HubServer, shared_settings: Settings
) -> None:
    request = example_request(
        "sft", "sft-qlora", dataset={"rows": CHAT_ROWS}, model={"id": "tiny/qwen2-chat", "quantization": "4bit"}
    )
    events = await run_to_end(shared_settings, request)
    failed = events[-1]
    assert isinstance(failed, Failed), failed
    assert (failed.code, failed.stage, failed.retryable) == ("cuda_required", "preflight", False)
    assert failed.message.startswith("model.quantization: 4bit")
    assert not any(event.type == "progress" for event in events)
    assert published.commits("results/sft-qlora") == []
