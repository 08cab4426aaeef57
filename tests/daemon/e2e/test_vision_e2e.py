"""Vision-language post-training end to end through the daemon, on the tiny LLaVA: SFT, DPO and GRPO
on rows with images succeed, and what they push loads back with `AutoProcessor` and PEFT and
generates from an image; a bad inline image is rejected at intake and a bad image in a dataset
fails the job, each naming its row and field, while the daemon goes on with the others.

A Hub dataset with an `Image` feature trains too. One daemon runs all six requests, submitted together (one CPU slot
takes them in turn); each test reads its own request's events."""

import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.demo.requests import (
    VISION_CHAT_ROWS,
    VISION_PREFERENCE_ROWS,
    VISION_PROMPT_ROWS,
)
from schemas import Event, Failed, Rejected, Succeeded
from testbed.client import submit, terminal_events
from testbed.data import HUB_TOKEN
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.conftest import own_settings
from tests.helpers import EXAMPLES_DIR, SMALL_LORA, download

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

TRAINING = {"max_steps": 3, "learning_rate": 2e-2, "per_device_train_batch_size": 2}
NOT_AN_IMAGE = "data:image/png;base64," + base64.b64encode(b"not a picture").decode()


def vision_request(
    name: str, request_id: str, model: Path, dataset: dict[str, Any], **overrides: Any
) -> dict[str, Any]:
    """The README's `<name>.json` example on the tiny model, a small LoRA and a few steps."""
    request = json.loads((EXAMPLES_DIR / f"{name}.json").read_text())
    request.update(
        request_id=request_id,
        model={"id": str(model)},
        dataset=dataset,
        peft=SMALL_LORA,
        training=TRAINING,
        output={"repo_id": f"results/{request_id}"},
    )
    request.update(overrides)
    request.get("rewards", {}).pop("model", None)
    return request


IMAGE_DATASET = "tiny/vision-chat"


def publish_image_dataset(hub: HubServer, folder: Path) -> None:
    """The chat rows as the Hub keeps image datasets: Parquet with an `Image` feature (bytes inside)."""
    from datasets import Dataset, Image, List
    from huggingface_hub import HfApi

    rows = [
        {**row, "images": [{"bytes": base64.b64decode(row["images"][0].split(",", 1)[1]), "path": None}]}
        for row in VISION_CHAT_ROWS
    ]
    (folder / "data").mkdir(parents=True)
    Dataset.from_list(rows).cast_column("images", List(Image())).to_parquet(str(folder / "data" / "train.parquet"))
    api = HfApi(endpoint=hub.endpoint, token=HUB_TOKEN)
    api.create_repo(IMAGE_DATASET, repo_type="dataset", exist_ok=True)
    api.upload_folder(folder_path=folder, repo_id=IMAGE_DATASET, repo_type="dataset", commit_message="image rows")


@pytest.fixture(scope="module")
async def outcomes(
    kafka: str, hub: HubServer, tiny_vlm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, list[Event]]]:
    work = tmp_path_factory.mktemp("vision-e2e")
    data = work / "data"
    data.mkdir()
    (data / "train.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in [VISION_CHAT_ROWS[0], {**VISION_CHAT_ROWS[1], "images": [NOT_AN_IMAGE]}])
    )
    publish_image_dataset(hub, work / "hub-dataset")
    settings = (await own_settings(kafka, hub, work)).model_copy(
        update={
            "allowed_local_model_roots": [tiny_vlm_dir.parent],
            "allowed_local_dataset_roots": [data],
        }
    )
    requests = [
        vision_request(
            "sft-vision",
            "vision-bad-inline",
            tiny_vlm_dir,
            {"rows": [VISION_CHAT_ROWS[0], {**VISION_CHAT_ROWS[1], "images": ["https://x.example/a.png"]}]},
        ),
        vision_request("sft-vision", "vision-bad-dataset", tiny_vlm_dir, {"url": str(data / "train.jsonl")}),
        vision_request("sft-vision", "vision-sft", tiny_vlm_dir, {"rows": VISION_CHAT_ROWS}),
        vision_request("sft-vision", "vision-hub-dataset", tiny_vlm_dir, {"id": IMAGE_DATASET}),
        vision_request("dpo-vision", "vision-dpo", tiny_vlm_dir, {"rows": VISION_PREFERENCE_ROWS}),
        vision_request(
            "grpo-vision",
            "vision-grpo",
            tiny_vlm_dir,
            {"rows": VISION_PROMPT_ROWS},
            grpo={"num_generations": 4, "max_completion_length": 8, "beta": 0.0},
            training={**TRAINING, "per_device_train_batch_size": 4},
        ),
    ]
    daemon = DaemonProcess(settings, work / "daemon.log").start()
    try:
        for request in requests:
            await submit(settings, request)
        yield await terminal_events(settings, {r["request_id"] for r in requests}, timeout_s=600)
    finally:
        daemon.stop()


def assert_loads_and_generates(hub: HubServer, done: Succeeded, base: Path, cache: Path) -> None:
    """The pushed adapter, on its base, with the pushed processor: generates from an image, and its
    trained LoRA weights change what the model predicts for that image."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    pushed = download(hub.endpoint, done.repo_id, done.commit_sha, cache)
    processor = AutoProcessor.from_pretrained(pushed)
    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(base), pushed).eval()
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour is this square?"}]}
    ]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True)
    from PIL import Image

    inputs = processor(images=[Image.new("RGB", (48, 40), (220, 30, 30))], text=[prompt], return_tensors="pt")
    assert inputs["pixel_values"].shape[-2:] == (32, 32)
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        with model.disable_adapter():
            base_logits = model(**inputs).logits
        tuned_logits = model(**inputs).logits
    assert generated.shape[1] > inputs["input_ids"].shape[1]  # it generated from the image
    assert not torch.allclose(base_logits, tuned_logits)  # and the adapter is what it trained


def card_metadata(hub: HubServer, done: Succeeded, cache: Path) -> dict[str, Any]:
    import yaml

    text = (download(hub.endpoint, done.repo_id, done.commit_sha, cache) / "README.md").read_text()
    return yaml.safe_load(text.split("---")[1])


@pytest.mark.parametrize("method", ["sft", "dpo", "grpo"])
async def test_vision_job_succeeds_and_its_push_loads_and_generates_from_an_image(
    method: str,
    outcomes: dict[str, list[Event]],
    hub: HubServer,
    tiny_vlm_dir: Path,
    tmp_path: Path,
) -> None:
    done = outcomes[f"vision-{method}"][-1]
    assert isinstance(done, Succeeded), done
    assert done.method == method
    assert {"processor_config.json", "chat_template.jinja", "adapter_model.safetensors"} <= set(done.files)
    card = card_metadata(hub, done, tmp_path)
    assert card["pipeline_tag"] == "image-text-to-text" and card["library_name"] == "peft"
    assert_loads_and_generates(hub, done, tiny_vlm_dir, tmp_path)


async def test_a_hub_dataset_with_an_image_feature_trains(outcomes: dict[str, list[Event]]) -> None:
    done = outcomes["vision-hub-dataset"][-1]
    assert isinstance(done, Succeeded), done
    assert [(s.kind, s.location) for s in done.dataset_sources] == [("hub", IMAGE_DATASET)]


async def test_a_bad_inline_image_is_rejected_naming_row_and_field(outcomes: dict[str, list[Event]]) -> None:
    [rejected] = outcomes["vision-bad-inline"]
    assert isinstance(rejected, Rejected) and rejected.reason == "invalid", rejected
    assert [(e.path, e.message.split(" (")[0]) for e in rejected.errors] == [
        ("dataset.rows.1.images.0", "an inline image is base64 data in a data:image/...;base64, URI"),
    ]


async def test_a_bad_image_in_a_dataset_fails_the_job_naming_row_and_field(outcomes: dict[str, list[Event]]) -> None:
    failed = outcomes["vision-bad-dataset"][-1]
    assert isinstance(failed, Failed), failed
    assert (failed.code, failed.stage) == ("dataset_invalid", "preflight")
    assert failed.message.startswith("dataset row 1: images.0: not a decodable image"), failed.message
