"""Images in a request's rows, as the contract sees them: the columns that hold them (TRL's `images`,
a list, or `image`, one), how many image entries a row's messages make room for, the one form an
inline image takes (base64 data in a `data:image/...;base64,` URI: a request never makes the host
fetch a URL), and the operator's bounds on them.

Decoding is not done here (this package needs pydantic only): intake decodes inline rows
(daemon/admission/images.py), the child decodes a dataset's rows (handlers/toolkit/vision.py); both read a row
through `row_images` and `row_problems`, so both say the same thing of the same row.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import Field

from .common import Frozen

IMAGE_COLUMNS = ("images", "image")  # TRL's column names: a list of images per row, or one image
DATA_URI = re.compile(r"^data:image/[A-Za-z0-9.+-]+;base64,")


class ImageBounds(Frozen):
    """The operator's limits on the images of one job: set in daemon settings, carried to the child."""

    max_images_per_row: int = Field(8, ge=1, description="The most images one row may hold.")
    max_image_bytes: int = Field(
        8 * 2**20, ge=1, description="The largest encoded image (bytes), inline or in a dataset."
    )
    max_image_pixels: int = Field(4096 * 4096, ge=1, description="The most pixels (width × height) of a decoded image.")


def image_column(columns: Iterable[str]) -> str | None:
    """The column a dataset keeps its images in, or None for a text-only dataset."""
    present = set(columns)
    return next((name for name in IMAGE_COLUMNS if name in present), None)


def row_images(row: Mapping[str, Any], column: str) -> list[Any]:
    """The images of one row, as a list: `images` holds a list (None: no images), `image` one image."""
    value = row.get(column)
    if value is None:
        return []
    if column == "image":
        return [value]
    return list(value) if isinstance(value, list | tuple) else [value]


def image_entries(row: Mapping[str, Any]) -> int:
    """How many `{"type": "image"}` entries the row's messages hold, over every conversational column
    (`messages`, `prompt`, `chosen`, ...): each stands for one image, in order."""
    count = 0
    for value in row.values():
        if not isinstance(value, list):
            continue
        for message in value:
            content = message.get("content") if isinstance(message, Mapping) else None
            if isinstance(content, list):
                count += sum(1 for part in content if isinstance(part, Mapping) and part.get("type") == "image")
    return count


def row_problems(row: Mapping[str, Any], column: str, bounds: ImageBounds) -> list[tuple[str, str]]:
    """What is wrong with one row's images short of decoding them, as (field, message): the column's
    shape, their number against the operator's bound and against the image entries of the messages."""
    value = row.get(column)
    if column == "images" and value is not None and not isinstance(value, list | tuple):
        return [(column, f"a list of images, one per image entry of the messages; got {type(value).__name__}")]
    images = row_images(row, column)
    if len(images) > bounds.max_images_per_row:
        return [
            (
                column,
                f"{len(images)} images; this host allows at most "
                f"{bounds.max_images_per_row} per row (max_images_per_row)",
            )
        ]
    entries = image_entries(row)
    if entries != len(images):
        return [
            (
                column,
                f'{len(images)} image(s), but the row\'s messages have {entries} image entries ({{"type": "image"}}); '
                "they must match",
            )
        ]
    return []


def data_uri_bytes(value: str, bounds: ImageBounds) -> bytes:
    """The bytes of an inline image (`data:image/png;base64,...`); ValueError says what is wrong."""
    match = DATA_URI.match(value)
    if match is None:
        shown = value[:40] + ("..." if len(value) > 40 else "")
        raise ValueError(
            f"an inline image is base64 data in a data:image/...;base64, URI (a URL is never fetched); got {shown!r}"
        )
    encoded = value[match.end() :]
    if len(encoded) * 3 // 4 > bounds.max_image_bytes + 3:  # before decoding: the bound holds for what is read too
        raise ValueError(
            f"about {len(encoded) * 3 // 4} bytes; this host allows at most "
            f"{bounds.max_image_bytes} per image (max_image_bytes)"
        )
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"not valid base64: {exc}") from exc
    return check_size(data, bounds)


def check_size(data: bytes, bounds: ImageBounds) -> bytes:
    if len(data) > bounds.max_image_bytes:
        raise ValueError(
            f"{len(data)} bytes; this host allows at most {bounds.max_image_bytes} per image (max_image_bytes)"
        )
    return data


def check_pixels(width: int, height: int, bounds: ImageBounds) -> None:
    if width * height > bounds.max_image_pixels:
        raise ValueError(
            f"{width}x{height} pixels; this host allows at most {bounds.max_image_pixels} per image (max_image_pixels)"
        )
