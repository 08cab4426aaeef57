"""Intake's check of inline images (daemon/admission/images.py): each problem is a `rejected` reason naming the
row and the field, before any job exists; a URL is refused, never fetched."""

import base64
import io
import json
from typing import Any

import pytest
from PIL import Image

from daemon.admission.images import inline_image_errors
from daemon.cli.demo.requests import VISION_CHAT_ROWS, VISION_PROMPT_ROWS, square
from schemas import FieldError, RequestBase, decode_request
from schemas.images import ImageBounds
from tests.helpers import EXAMPLES_DIR

BOUNDS = ImageBounds()


def request(rows: list[dict[str, Any]], example: str = "sft-vision", **overrides: Any) -> RequestBase:
    body = json.loads((EXAMPLES_DIR / f"{example}.json").read_text())
    body.update(dataset={"rows": rows, **overrides})
    decoded = decode_request(json.dumps(body).encode())
    assert isinstance(decoded, RequestBase), decoded
    return decoded


def with_images(*images: Any, row: dict[str, Any] = VISION_CHAT_ROWS[0]) -> list[dict[str, Any]]:
    return [VISION_CHAT_ROWS[1], {**row, "images": list(images)}]


def test_good_rows_pass() -> None:
    assert inline_image_errors(request(VISION_CHAT_ROWS), BOUNDS) == []
    assert inline_image_errors(request(VISION_PROMPT_ROWS, "grpo-vision"), BOUNDS) == []


@pytest.mark.parametrize(
    ("images", "path", "says"),
    [
        (
            ["https://images.example/cat.png"],
            "dataset.rows.1.images.0",
            "an inline image is base64 data in a data:image/...;base64, URI (a URL is never fetched)",
        ),
        (["data:image/png;base64,@@@not-base64@@@"], "dataset.rows.1.images.0", "not valid base64"),
        (
            ["data:image/png;base64," + base64.b64encode(b"GIF? no. text.").decode()],
            "dataset.rows.1.images.0",
            "not a decodable image",
        ),
        ([{"bytes": "abc"}], "dataset.rows.1.images.0", "an inline image is a data:image/...;base64, string; got dict"),
        (
            [square((1, 2, 3)), square((4, 5, 6))],
            "dataset.rows.1.images",
            "2 image(s), but the row's messages have 1 image entries",
        ),
    ],
    ids=["url", "base64", "undecodable", "not-a-string", "count"],
)
def test_each_bad_inline_image_is_named_by_row_and_field(images: list[Any], path: str, says: str) -> None:
    [error] = inline_image_errors(request(with_images(*images)), BOUNDS)
    assert error.path == path and error.message.startswith(says), error


def test_a_truncated_png_is_caught_by_decoding_not_only_its_header() -> None:
    buffer = io.BytesIO()
    Image.effect_noise((64, 64), 50).convert("RGB").save(buffer, format="PNG")
    cut = "data:image/png;base64," + base64.b64encode(buffer.getvalue()[:-200]).decode()
    [error] = inline_image_errors(request(with_images(cut)), BOUNDS)
    assert (error.path, error.message.split(":")[0]) == ("dataset.rows.1.images.0", "not a decodable image")


def _data_uri(image: Image.Image, form: str, declared: str) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format=form)
    return f"data:image/{declared};base64," + base64.b64encode(buffer.getvalue()).decode()


@pytest.mark.parametrize("form", ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"])
def test_the_six_formats_are_read_whatever_type_their_uri_declares(form: str) -> None:
    image = Image.new("RGB", (16, 16), (200, 30, 30))
    assert inline_image_errors(request(with_images(_data_uri(image, form, "jpeg"))), BOUNDS) == []


@pytest.mark.parametrize(
    "form", ["TGA", "PPM", "ICO"]
)  # Pillow reads each; a signature-less one costs it every plugin's try
def test_other_formats_are_refused_by_their_first_bytes(form: str) -> None:
    [error] = inline_image_errors(request(with_images(_data_uri(Image.new("RGB", (16, 16)), form, "png"))), BOUNDS)
    assert (
        error.path == "dataset.rows.1.images.0"
        and "start as no PNG, JPEG, GIF, WebP, BMP or TIFF file does" in error.message
    )


def test_the_operators_bounds() -> None:
    big = square((9, 9, 9), size=64)
    assert inline_image_errors(request(with_images(big)), ImageBounds(max_image_pixels=64 * 64 - 1)) == [
        FieldError(
            path="dataset.rows.1.images.0",
            message="64x64 pixels; this host allows at most 4095 per image (max_image_pixels)",
        ),
    ]
    errors = inline_image_errors(request(with_images(big)), ImageBounds(max_image_bytes=10))
    assert [e.path for e in errors] == [
        "dataset.rows.0.images.0",
        "dataset.rows.1.images.0",
    ]  # every row's image is over 10 bytes
    assert all(e.message.endswith("this host allows at most 10 per image (max_image_bytes)") for e in errors), errors
    many = {**VISION_CHAT_ROWS[0], "messages": [{"role": "user", "content": [{"type": "image"}] * 3}]}
    assert inline_image_errors(request([many | {"images": [big] * 3}]), ImageBounds(max_images_per_row=2)) == [
        FieldError(
            path="dataset.rows.0.images", message="3 images; this host allows at most 2 per row (max_images_per_row)"
        ),
    ]


def test_a_renamed_image_column_is_named_as_the_rows_name_it() -> None:
    rows = [{"messages": row["messages"], "pictures": ["ftp://x/y.png"]} for row in VISION_CHAT_ROWS]
    errors = inline_image_errors(request(rows, columns={"pictures": "images"}), BOUNDS)
    assert [e.path for e in errors] == [f"dataset.rows.{i}.pictures.0" for i in range(len(rows))]


def test_a_text_only_method_refuses_rows_with_images() -> None:
    body = json.loads((EXAMPLES_DIR / "kto.json").read_text())
    body["dataset"] = {
        "rows": [{"prompt": "What colour?", "completion": "red", "label": True, "images": [square((1, 1, 1))]}]
    }
    rejected = decode_request(json.dumps(body).encode())
    assert not isinstance(rejected, RequestBase)
    assert any(
        "'images': method kto trains on text only; the vision-language methods are sft, dpo, grpo" in e.message
        for e in rejected.errors
    ), rejected


def test_a_text_only_method_refuses_an_image_column_only_some_rows_have() -> None:
    """The columns every row has are checked with the method's formats; the image check also reads
    the columns only some rows have, since one image is as unreadable to a text-only method."""
    body = json.loads((EXAMPLES_DIR / "kto.json").read_text())
    text = {"prompt": "What colour?", "completion": "red", "label": True}
    body["dataset"] = {"rows": [text, {**text, "images": [square((1, 1, 1))]}]}
    rejected = decode_request(json.dumps(body).encode())
    assert not isinstance(rejected, RequestBase)
    assert any("'images': method kto trains on text only" in e.message for e in rejected.errors), rejected


def webp_bomb() -> str:
    """A 4096x4096 lossless WebP of a few hundred bytes: 0.2 s to decode (issue 37)."""
    buffer = io.BytesIO()
    Image.new("RGB", (4096, 4096), (10, 20, 30)).save(buffer, "WEBP", lossless=True)
    return "data:image/webp;base64," + base64.b64encode(buffer.getvalue()).decode()


def vision_record(core: Any, rows: list[dict[str, Any]], offset: int = 0) -> Any:
    from tests.fakes import FakeRecord

    body = json.loads((EXAMPLES_DIR / "sft-vision.json").read_text())
    body.update(request_id="bombs", dataset={"rows": rows})
    return FakeRecord(core.tp.topic, 0, offset, b"bombs", json.dumps(body).encode())


async def test_images_are_checked_off_the_event_loop_by_their_headers(tmp_path: Any) -> None:
    import asyncio
    import time

    from daemon.settings import Settings
    from tests.core import CoreOnFakes

    core = CoreOnFakes(Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work"))
    bomb = webp_bomb()
    rows = [{**VISION_CHAT_ROWS[0], "images": [bomb]} for _ in range(32)]
    rows[-1] = {**rows[-1], "images": ["data:image/png;base64," + base64.b64encode(b"not an image").decode()]}
    pauses: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:  # the loop's other work: how long it waits for a turn
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0)
            now = time.perf_counter()
            pauses.append(now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    started = time.perf_counter()
    await core.intake.take(core.tp, [vision_record(core, rows)])
    took = time.perf_counter() - started
    done.set()
    await ticking
    await core.partitions.settled(core.tp)
    [event] = core.events("bombs")
    assert event["type"] == "rejected" and [error["path"] for error in event["errors"]] == ["dataset.rows.31.images.0"]
    # Decoding their pixels would take 32 x 0.2 s; their headers take milliseconds, and not on the loop.
    assert took < 1.0 and max(pauses) < 0.1


async def test_images_that_take_past_the_deadline_are_refused_naming_the_rows(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from daemon import intake
    from daemon.admission import judge
    from daemon.settings import Settings
    from tests.core import CoreOnFakes

    release = threading.Event()

    def stuck(*args: object) -> list[FieldError]:  # a check that does not end by itself
        release.wait()
        return []

    monkeypatch.setattr(intake, "JUDGE_DEADLINE_S", 0.05)
    monkeypatch.setattr(judge, "inline_image_errors", stuck)
    core = CoreOnFakes(Settings(gpus=[], warm_child=False, work_dir=tmp_path / "work"))
    try:
        await core.intake.take(core.tp, [vision_record(core, VISION_CHAT_ROWS)])
    finally:
        release.set()
    await core.partitions.settled(core.tp)
    [event] = core.events("bombs")
    assert event["type"] == "rejected" and [error["path"] for error in event["errors"]] == ["dataset.rows"]


def test_an_image_pillow_cannot_identify_is_said_the_same_way_at_every_judging() -> None:
    # A PNG's signature and nothing a PNG has after it: Pillow names its BytesIO object's address in its own
    # message, which means nothing to a producer and differs from one judging to the next.
    fake = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"not the chunks of a PNG").decode()
    first, again = (inline_image_errors(request(with_images(fake)), BOUNDS) for _ in range(2))
    assert first == again
    [error] = first
    assert error.message == "not a decodable image: Pillow cannot read it as the PNG file its first bytes say it is"
