"""Vision-language jobs in the child, without a daemon: the tiny LLaVA trains with LoRA on its
language model only and saves its processor beside the adapter; and every bad image in a dataset,
or a base model that cannot see, fails before training, naming the row and the field."""

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from daemon.cli.demo.requests import (
    VISION_CHAT_ROWS,
    VISION_PREFERENCE_ROWS,
    VISION_PROMPT_ROWS,
    square,
)
from handlers.protocol import JobFailed, TrainResult
from schemas.images import ImageBounds
from tests.helpers import SMALL_LORA, example_request, run_handler

TRAINING = {"max_steps": 2, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
NOT_AN_IMAGE = "data:image/png;base64," + base64.b64encode(b"these bytes are not a picture").decode()


def vision_request(request_id: str, model: Path, dataset: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    return example_request(
        "sft-vision", request_id, **{"model": {"id": str(model)}, "dataset": dataset, "training": TRAINING, **overrides}
    )


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_sft_trains_the_language_model_only_and_saves_the_processor(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    result, _ = run_handler(vision_request("vision-sft", tiny_vlm_dir, {"rows": VISION_CHAT_ROWS}), tmp_path)
    assert isinstance(result, TrainResult), result
    assert result.pipeline_tag == "image-text-to-text"
    artifact = tmp_path / "artifact"
    assert {"adapter_config.json", "processor_config.json", "chat_template.jinja", "tokenizer.json"} <= {
        p.name for p in artifact.iterdir()
    }
    weights = load_file(artifact / "adapter_model.safetensors")
    assert weights and all(".language_model." in name for name in weights), sorted(weights)[:5]
    assert not [name for name in weights if "vision_tower" in name or "multi_modal_projector" in name]


VISION_PARTS = ("vision", "visual", "multi_modal_projector", "connector", "merger")  # each family's tower and projector


@pytest.fixture(scope="session")
def tiny_vlm_of(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The tiny model of a family (handlers/fixtures/tiny_vlm.py), built once per session when first asked for."""
    from handlers.fixtures.tiny_vlm import save_tiny_vlm

    built: dict[str, Path] = {}

    def of(family: str) -> Path:
        if family not in built:
            built[family] = save_tiny_vlm(tmp_path_factory.mktemp(f"tiny-{family}"), family)
        return built[family]

    return of


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sft", "dpo", "grpo"])
@pytest.mark.parametrize("family", ["qwen2-vl", "idefics3"])
def test_other_families_train_their_language_model_only(
    family: str,
    method: str,
    tiny_vlm_of: Callable[[str], Path],
    tmp_path: Path,
) -> None:
    """Qwen2-VL's language model is `model.language_model`, Idefics3's `model.text_model`: LoRA finds each."""
    from safetensors.torch import load_file

    rows = {"sft": VISION_CHAT_ROWS, "dpo": VISION_PREFERENCE_ROWS, "grpo": VISION_PROMPT_ROWS}[method]
    extra = {"grpo": {"grpo": {"num_generations": 2, "max_completion_length": 8, "beta": 0.0}}}.get(method, {})
    request = example_request(
        f"{method}-vision",
        f"{family}-{method}",
        **{
            "model": {"id": str(tiny_vlm_of(family))},
            "dataset": {"rows": rows},
            "training": TRAINING,
            **extra,
        },
    )
    result, _ = run_handler(request, tmp_path)
    assert isinstance(result, TrainResult), result
    weights = load_file(tmp_path / "artifact" / "adapter_model.safetensors")
    assert weights and not [name for name in weights if any(part in name for part in VISION_PARTS)], sorted(weights)[:5]


def test_a_request_may_widen_lora_to_the_vision_tower(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    request = vision_request(
        "vision-wide", tiny_vlm_dir, {"rows": VISION_CHAT_ROWS}, peft={**SMALL_LORA, "target_modules": "all-linear"}
    )
    result, _ = run_handler(request, tmp_path)
    assert isinstance(result, TrainResult), result
    assert any("vision_tower" in name for name in load_file(tmp_path / "artifact" / "adapter_model.safetensors"))


@pytest.mark.parametrize(
    ("row", "says"),
    [
        ({**VISION_CHAT_ROWS[0], "images": [NOT_AN_IMAGE]}, "dataset row 1: images.0: not a decodable image"),
        (
            {**VISION_CHAT_ROWS[0], "images": [square((1, 2, 3)), square((4, 5, 6))]},
            "dataset row 1: images: 2 image(s), but the row's messages have 1 image entries",
        ),
        (
            {**VISION_CHAT_ROWS[0], "images": ["/etc/hostname"]},
            "dataset row 1: images.0: /etc/hostname is outside allowed_local_dataset_roots",
        ),
        (
            {**VISION_CHAT_ROWS[0], "images": ["http://images.example/cat.png"]},
            "dataset row 1: images.0: http://images.example/cat.png is not allowed on this host (allowed_dataset_urls)",
        ),
        ({**VISION_CHAT_ROWS[0], "images": ["cat.png"]}, "dataset row 1: images.0: 'cat.png' is a relative path"),
    ],
    ids=["undecodable", "count", "host-file", "url", "relative"],
)
def test_a_bad_image_in_a_dataset_fails_in_preflight_naming_row_and_field(
    row: dict[str, Any],
    says: str,
    tiny_vlm_dir: Path,
    tmp_path: Path,
) -> None:
    data = write_jsonl(tmp_path / "data" / "train.jsonl", [VISION_CHAT_ROWS[1], row, VISION_CHAT_ROWS[2]])
    failure, sent = run_handler(
        vision_request("vision-bad", tiny_vlm_dir, {"url": str(data)}),
        tmp_path / "job",
        allowed_local_dataset_roots=[tmp_path / "data"],
    )
    assert isinstance(failure, JobFailed), failure
    assert (failure.code, failure.stage) == ("dataset_invalid", "preflight")
    assert failure.message.startswith(says), failure.message
    assert "load_model" not in [m.get("stage") for m in sent if m["kind"] == "stage"]  # no model was loaded


def test_images_from_allowed_files_and_parquet_bytes_train(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    """An image path under an allowed root is read; Parquet from `datasets` holds an `Image` feature's bytes."""
    from datasets import Dataset, Image, List

    pictures = tmp_path / "data" / "pictures"
    pictures.mkdir(parents=True)
    rows = []
    for index, row in enumerate(VISION_CHAT_ROWS):
        path = pictures / f"{index}.png"
        path.write_bytes(base64.b64decode(row["images"][0].split(",", 1)[1]))
        rows.append({**row, "images": [str(path)]})
    files = write_jsonl(tmp_path / "data" / "paths.jsonl", rows)
    result, _ = run_handler(
        vision_request("vision-paths", tiny_vlm_dir, {"url": str(files)}),
        tmp_path / "paths",
        allowed_local_dataset_roots=[tmp_path / "data"],
    )
    assert isinstance(result, TrainResult), result

    embedded = [
        {**row, "images": [{"bytes": Path(r["images"][0]).read_bytes(), "path": None}]}
        for row, r in zip(VISION_CHAT_ROWS, rows, strict=True)
    ]
    Dataset.from_list(embedded).cast_column("images", List(Image())).to_parquet(
        str(tmp_path / "data" / "embedded.parquet")
    )
    result, _ = run_handler(
        vision_request("vision-parquet", tiny_vlm_dir, {"url": str(tmp_path / "data" / "embedded.parquet")}),
        tmp_path / "parquet",
        allowed_local_dataset_roots=[tmp_path / "data"],
    )
    assert isinstance(result, TrainResult), result


def test_a_streamed_dataset_checks_each_row_as_it_is_read(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "data" / "good.jsonl", VISION_CHAT_ROWS)
    result, _ = run_handler(
        vision_request("vision-stream", tiny_vlm_dir, {"url": str(good), "streaming": True}),
        tmp_path / "good",
        allowed_local_dataset_roots=[tmp_path / "data"],
    )
    assert isinstance(result, TrainResult), result
    bad = write_jsonl(
        tmp_path / "data" / "bad.jsonl", [VISION_CHAT_ROWS[0], {**VISION_CHAT_ROWS[1], "images": ["/etc/hostname"]}]
    )
    failure, _ = run_handler(
        vision_request("vision-stream-bad", tiny_vlm_dir, {"url": str(bad), "streaming": True}),
        tmp_path / "bad",
        allowed_local_dataset_roots=[tmp_path / "data"],
    )
    assert isinstance(failure, JobFailed), failure
    assert (failure.code, failure.stage) == ("dataset_invalid", "train")
    assert failure.message.startswith("dataset row 1: images.0: /etc/hostname is outside allowed_local_dataset_roots")


def test_an_image_over_the_operators_bounds_fails(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    bounds = ImageBounds(max_image_pixels=32 * 32 - 1)
    data = write_jsonl(tmp_path / "data" / "train.jsonl", VISION_CHAT_ROWS)
    failure, _ = run_handler(
        vision_request("vision-big", tiny_vlm_dir, {"url": str(data)}),
        tmp_path / "job",
        allowed_local_dataset_roots=[tmp_path / "data"],
        images=bounds,
    )
    assert isinstance(failure, JobFailed), failure
    assert (
        failure.message
        == "dataset row 0: images.0: 32x32 pixels; this host allows at most 1023 per image (max_image_pixels)"
    )


def test_rows_with_images_on_a_text_only_model_fail_naming_the_model(tiny_model_dir: Path, tmp_path: Path) -> None:
    failure, _ = run_handler(vision_request("vision-text-model", tiny_model_dir, {"rows": VISION_CHAT_ROWS}), tmp_path)
    assert isinstance(failure, JobFailed), failure
    assert (failure.code, failure.stage) == ("dataset_invalid", "preflight")
    assert failure.message.startswith(f"model.id: {tiny_model_dir} is not a vision-language model"), failure.message


def test_a_processor_without_a_chat_template_fails(tiny_vlm_dir: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny_vlm_dir, tmp_path / "no-template")
    (model / "chat_template.jinja").unlink()
    failure, _ = run_handler(vision_request("vision-no-template", model, {"rows": VISION_CHAT_ROWS}), tmp_path / "job")
    assert isinstance(failure, JobFailed), failure
    assert failure.message == f"model.id: {model}'s processor has no chat template; set model.chat_template"
