"""Intake's check of the images in a request's inline rows, before it becomes a job: each is inline
base64 data (a URL in a request is never fetched), an image Pillow can identify and verify, and
keeps to the operator's bounds (max_images_per_row, max_image_bytes, max_image_pixels); a row has
as many images as its messages have image entries. Each problem is named by its row and field, e.g.
`dataset.rows.3.images.0`.

Intake reads each image's header, never its pixels (issue 37): the dimensions, and Pillow's
`verify` (for a PNG, every chunk and its checksum: a truncated or corrupted file is caught), all in
time linear in the bytes. Decoding is linear in the pixels instead: a 4096x4096 lossless WebP of
a few hundred bytes takes 0.2 s, so a 1 MB request of them would hold intake for minutes. The
child decodes every image before training (handlers/toolkit/vision.py) and fails the job naming the row
if one does not decode, in the job's own time.

The format is read from the file's first bytes (FORMATS), and Pillow opens the file as that format
only: Pillow by itself tries its plugins in turn, several of them formats without a signature, which
cost as much again as the check itself (65 us an image against 31 for a 4096x4096 WebP). A request's
inline images are PNG, JPEG, GIF, WebP, BMP or TIFF, whatever type their data URI says.
"""

from __future__ import annotations

import io
import warnings

from PIL import Image, UnidentifiedImageError

from schemas import FieldError
from schemas.images import (
    ImageBounds,
    check_pixels,
    data_uri_bytes,
    image_column,
    row_images,
    row_problems,
)
from schemas.request import RequestBase


def has_inline_images(request: RequestBase) -> bool:
    """Whether the request's inline rows have an image column (what `inline_image_errors` decodes)."""
    rows = request.dataset.rows
    if rows is None:
        return False
    return image_column({request.dataset.columns.get(name, name) for row in rows for name in row}) is not None


def inline_image_errors(request: RequestBase, bounds: ImageBounds) -> list[FieldError]:
    """Every problem with the images of the request's inline rows; empty when there are none."""
    rows = request.dataset.rows
    if rows is None:
        return []
    renamed = {request.dataset.columns.get(name, name): name for row in rows for name in row}
    column = image_column(renamed)
    if column is None:
        return []
    source = renamed[column]  # the name the rows use, before `dataset.columns` renames it
    errors = []
    for index, row in enumerate(rows):
        as_trained = {renamed_name: row[name] for renamed_name, name in renamed.items() if name in row}
        problems = row_problems(as_trained, column, bounds)
        errors += [FieldError(path=f"dataset.rows.{index}.{source}", message=message) for _, message in problems]
        if problems:
            continue
        for position, image in enumerate(row_images(as_trained, column)):
            path = f"dataset.rows.{index}.{source}" + (f".{position}" if column == "images" else "")
            problem = _image_problem(image, bounds)
            if problem:
                errors.append(FieldError(path=path, message=problem))
    return errors


# Pillow's name for each format an inline image may have, by the signature its file starts with.
FORMATS: dict[bytes, str] = {
    b"\x89PNG\r\n\x1a\n": "PNG",
    b"\xff\xd8\xff": "JPEG",
    b"GIF87a": "GIF",
    b"GIF89a": "GIF",
    b"BM": "BMP",
    b"II*\x00": "TIFF",
    b"MM\x00*": "TIFF",
}


def image_format(data: bytes) -> str | None:
    """Pillow's name for the format of an image file, from its signature, or None for any other."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return next((name for signature, name in FORMATS.items() if data.startswith(signature)), None)


def _image_problem(value: object, bounds: ImageBounds) -> str | None:
    if not isinstance(value, str):
        return f"an inline image is a data:image/...;base64, string; got {type(value).__name__}"
    try:
        data = data_uri_bytes(value, bounds)
        kind = image_format(data)
        if kind is None:
            return (
                "not a decodable image: its bytes start as no PNG, JPEG, GIF, WebP, BMP or "
                f"TIFF file does ({data[:12]!r})"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=[kind]) as image:
                check_pixels(image.width, image.height, bounds)  # from the header
                image.verify()  # the file's structure, not its pixels (see the module's docstring)
    except ValueError as exc:
        return str(exc)
    except UnidentifiedImageError:
        # Pillow's message names the BytesIO object's address: meaningless to a producer,
        # and different at every judging.
        return f"not a decodable image: Pillow cannot read it as the {kind} file its first bytes say it is"
    except (OSError, Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        return f"not a decodable image: {exc}"
    return None
