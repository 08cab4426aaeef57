"""Vision-language jobs, in the child: a dataset's images checked and decoded before any model loads,
the base loaded as transformers loads a vision-language model (`AutoModelForImageTextToText` and
its `AutoProcessor`), and LoRA aimed at the language model with the vision tower left frozen.

An image in a dataset is read from its own bytes (a Hub `Image` feature, Parquet written by
`datasets`), from inline base64 data (`data:image/...;base64,`), or from a path or URL only where the
operator's rules allow a dataset to be read (`allowed_local_dataset_roots`, `allowed_dataset_urls`):
datasets would otherwise open whatever path an `Image` value names, on this host or on the network.
Each image that does not decode, breaks the operator's bounds, or does not match the row's image
entries fails the job naming its row and field (e.g. `dataset row 3: images.0: ...`).
"""

from __future__ import annotations

import io
import re
import warnings
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import fsspec
from datasets import Dataset, Features, Image, List
from PIL import Image as PILImage
from PIL import UnidentifiedImageError
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForImageTextToText,
    AutoProcessor,
    PreTrainedModel,
    ProcessorMixin,
)

from handlers.protocol import JobFailed, JobSpec
from handlers.toolkit.loading import column_names
from handlers.toolkit.reporting import loading_weights
from handlers.toolkit.sources import AnyDataset
from schemas.images import (
    ImageBounds,
    check_pixels,
    check_size,
    data_uri_bytes,
    image_column,
    row_images,
    row_problems,
)
from schemas.locations import has_parent_segment, within
from schemas.request import ModelSpec

PIPELINE_TAG = "image-text-to-text"


def prepare_images(rows: AnyDataset, job: JobSpec, trusted_roots: list[Path]) -> AnyDataset:
    """The rows with every image checked and held as its encoded bytes, typed as datasets' `Image`,
    so the trainer gets decoded images. A map-style dataset is checked whole here, before training;
    a stream is checked row by row as it is read. `trusted_roots`: where datasets itself put files
    (its cache, for a Hub dataset), besides the operator's roots."""
    column = image_column(
        column_names(rows)
    )  # a stream whose format does not say is read for its first row, as load_base reads it
    if column is None:
        return rows
    if rows.features is not None and column in rows.features:
        # Undecoded: datasets would open an `Image` value's path itself, wherever it points.
        undecoded = Image(decode=False) if column == "image" else List(Image(decode=False))
        rows = rows.cast_column(column, undecoded)
    stored = isinstance(rows, Dataset)
    stage = "preflight" if stored else "train"  # a stream's rows are checked as training reads them
    typed = Image() if column == "image" else List(Image())
    roots = [*job.allowed_local_dataset_roots, *trusted_roots]

    def check(row: dict[str, Any], index: int) -> dict[str, Any]:
        problems = row_problems(row, column, job.images)
        if problems:
            raise JobFailed("dataset_invalid", stage, f"dataset row {index}: {problems[0][0]}: {problems[0][1]}")
        encoded = []
        for position, value in enumerate(row_images(row, column)):
            field = f"{column}.{position}" if column == "images" else column
            try:
                data = _checked(_image_bytes(value, job, roots), job.images)
            except ValueError as exc:
                raise JobFailed("dataset_invalid", stage, f"dataset row {index}: {field}: {exc}") from exc
            # A dataset's rows keep the bytes, typed as `Image` (decoded as read); a stream's rows are
            # not typed again after a map, so they carry the decoded image.
            encoded.append({"bytes": data, "path": None} if stored else PILImage.open(io.BytesIO(data)))
        return {column: encoded[0] if column == "image" else encoded}

    if stored:
        return rows.map(
            check, with_indices=True, features=Features({**rows.features, column: typed}), desc="checking images"
        )
    return rows.map(check, with_indices=True)


def _image_bytes(value: Any, job: JobSpec, roots: list[Path]) -> bytes:
    """The encoded bytes of one image value, read only from where the operator's rules allow."""
    if isinstance(value, PILImage.Image):  # a dataset whose images were decoded already (no path to follow)
        buffer = io.BytesIO()
        value.save(buffer, format=value.format or "PNG")
        return buffer.getvalue()
    if isinstance(value, dict) and value.get("bytes") is not None:
        return bytes(value["bytes"])
    location = value.get("path") if isinstance(value, dict) else value
    if not isinstance(location, str):
        raise ValueError(
            f"an image is its bytes, base64 data (data:image/...;base64,) or a path; got {type(value).__name__}"
        )
    if location.startswith("data:"):
        return data_uri_bytes(location, job.images)
    return _read_location(location, job, roots)


def _read_location(location: str, job: JobSpec, roots: list[Path]) -> bytes:
    if "::" in location:
        raise ValueError(f"{location[:200]}: an image location may not chain filesystems ('::')")
    protocol, _ = fsspec.core.split_protocol(location)  # the scheme as fsspec reads it, which is what it opens
    if protocol is None and location.startswith("/"):
        if not within(location, roots):
            raise ValueError(
                f"{location} is outside allowed_local_dataset_roots; an image is read only from where a dataset may be"
            )
        opened = fsspec.open(str(Path(location).resolve()), "rb")
    elif protocol is not None and protocol != "file" and "://" in location:
        if not any(fnmatchcase(location, pattern) for pattern in job.allowed_dataset_urls) or has_parent_segment(
            location
        ):
            raise ValueError(
                f"{location} is not allowed on this host (allowed_dataset_urls); an image URL is "
                "read only where a dataset may be"
            )
        opened = fsspec.open(location, "rb", **job.storage_options.get(protocol, {}))
    else:
        raise ValueError(
            f"{location!r} is a relative path; give the image's bytes, base64 data or an absolute path or URL"
        )
    with opened as handle:
        data = handle.read(job.images.max_image_bytes + 1)
    return data


def _checked(data: bytes, bounds: ImageBounds) -> bytes:
    """The bytes, once they are known to decode into an image within the operator's bounds."""
    check_size(data, bounds)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            with PILImage.open(io.BytesIO(data)) as image:
                check_pixels(image.width, image.height, bounds)  # from the header, before the pixels are decoded
                image.load()
    except (UnidentifiedImageError, OSError, PILImage.DecompressionBombWarning, PILImage.DecompressionBombError) as exc:
        raise ValueError(f"not a decodable image: {exc}") from exc
    return data


def is_vision_model(path: str, spec: ModelSpec) -> bool:
    """Whether the model's config says it sees images (a `vision_config`, as every vision-language
    model transformers ships has)."""
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model", f"model.id: {spec.id} has no loadable config: {exc}"
        ) from exc
    return getattr(config, "vision_config", None) is not None  # only a vision-language config class has one


def load_processor(path: str, spec: ModelSpec) -> ProcessorMixin:
    """The model's processor (image processor, tokenizer, chat template), which must have a chat
    template: vision-language rows are conversational, their image entries placed by the template."""
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=spec.trust_remote_code)
    except (OSError, ValueError, TypeError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model", f"model.id: {spec.id} has no loadable processor: {exc}"
        ) from exc
    # a processor of text alone has no image processor
    if not isinstance(processor, ProcessorMixin) or getattr(processor, "image_processor", None) is None:
        raise JobFailed(
            "model_unavailable",
            "load_model",
            f"model.id: {spec.id} has no image processor (AutoProcessor gave {type(processor).__name__})",
        )
    if spec.chat_template is not None:  # the request's own template; saved with the artifact, so it is pushed too
        processor.chat_template = spec.chat_template
    if processor.chat_template is None:
        raise JobFailed(
            "dataset_invalid",
            "preflight",
            f"model.id: {spec.id}'s processor has no chat template; set model.chat_template",
        )
    if processor.tokenizer.pad_token is None:
        processor.tokenizer.pad_token = processor.tokenizer.eos_token
    return processor


def load_vision_model(path: str, spec: ModelSpec, field: str, kwargs: dict[str, Any]) -> PreTrainedModel:
    try:
        with loading_weights():
            return AutoModelForImageTextToText.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise JobFailed(
            "model_unavailable", "load_model", f"{field}.id: {spec.id} is not a loadable vision-language model: {exc}"
        ) from exc


def language_model_targets(model: PreTrainedModel) -> str:
    """LoRA's `target_modules` for a vision-language model: every linear layer of its language model
    and none of the vision tower or the projector, as one regular expression (PEFT matches it against
    the whole module name)."""
    language_model = model.get_decoder()
    prefix = next(name for name, module in model.named_modules() if module is language_model)
    leaves = sorted(
        {name.rsplit(".", 1)[-1] for name, module in language_model.named_modules() if isinstance(module, nn.Linear)}
    )
    return rf"{re.escape(prefix)}\..*\.({'|'.join(map(re.escape, leaves))})"
