"""Where a request's rows come from: a Hub dataset, object storage, files under a local root the
operator allows, or inline rows; an evaluation set from its own source; a mixture of sources with
proportions; and streaming for sets larger than the disk.

Which sources a host accepts is the operator's policy (daemon/admission/policy.py); this module only says
what is well-formed. One rule is the schema's own: a Hub id (`id`) names a dataset on the Hub and
nothing else, so its `data_files` are paths inside that repo, never an absolute path or a URL.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, JsonValue, field_validator, model_validator

from .common import HUB_ID_PATTERN, Frozen, HubRevision
from .locations import has_parent_segment

MAX_INLINE_ROWS = 10_000
# The handbook's SmolLM3 SFT recipe mixes 25 sources; each is one more listing and load in the child.
MAX_MIXTURE_SOURCES = 64

# A Hub dataset id: "name" or "namespace/name".
DATASET_ID_PATTERN = HUB_ID_PATTERN
# Object storage through fsspec, or an absolute local path; globs allowed in the path.
OBJECT_STORAGE_SCHEMES = ("s3", "gs", "gcs", "az", "abfs", "abfss")
LOCATION_PATTERN = rf"^(/\S*|({'|'.join(OBJECT_STORAGE_SCHEMES)})://\S+)$"

DatasetFormat = Literal["json", "jsonl", "parquet", "csv", "arrow"]
Location = str  # validated by LOCATION_PATTERN where it is used


class SourceSpec(Frozen):
    """One source of rows: exactly one of `id` (Hub), `url` (object storage or a local path), `files`
    (locations per split) or `rows` (inline)."""

    id: str | None = Field(
        None,
        pattern=DATASET_ID_PATTERN,
        description="Hub dataset repo id; read from the Hub only, never from a local folder.",
    )
    config: str | None = Field(None, description="Hub dataset configuration name.")
    split: str = Field("train", description="The split to read (a Hub split, or a key of `files`).")
    revision: HubRevision = Field(None, description="Branch, tag or commit sha of the Hub dataset.")
    data_files: str | list[str] | dict[str, str | list[str]] | None = Field(
        None,
        description="Files inside the Hub dataset repo (relative paths or globs); never an absolute path or a URL.",
    )
    url: str | None = Field(
        None,
        pattern=LOCATION_PATTERN,
        description="s3://, gs://, az:// or abfs:// URL, or an absolute local path: a file, a glob, or a folder "
        "(every file of the format in it).",
    )
    files: dict[str, str | list[str]] | None = Field(
        None, description="Locations (URLs or absolute local paths, globs allowed) per split."
    )
    format: DatasetFormat | None = Field(None, description="File format; by extension when absent.")
    rows: list[dict[str, JsonValue]] | None = Field(
        None, min_length=1, max_length=MAX_INLINE_ROWS, description="Inline rows, at most 10,000."
    )
    columns: dict[str, str] = Field(
        default_factory=dict,
        description="Renames dataset columns onto the names the method expects: {dataset_column: expected_column}.",
    )

    def given(self) -> list[str]:
        """The source fields set; exactly one must be."""
        given = {"id": self.id, "url": self.url, "files": self.files, "rows": self.rows}
        return [name for name, value in given.items() if value is not None]

    def locations(self) -> list[tuple[str, str]]:
        """(field path, location) of every URL or local path this source names."""
        found = [("url", self.url)] if self.url is not None else []
        for split, value in (self.files or {}).items():
            items = [value] if isinstance(value, str) else value
            found += [
                (f"files.{split}" if isinstance(value, str) else f"files.{split}.{i}", item)
                for i, item in enumerate(items)
            ]
        return found

    @model_validator(mode="after")
    def _well_formed(self) -> SourceSpec:
        self._check_one_source()
        if self.id is None:
            for name, value in (("config", self.config), ("revision", self.revision), ("data_files", self.data_files)):
                if value is not None:
                    raise ValueError(
                        f"{name}: belongs to a Hub dataset ('id'); other sources name their files in 'url' or 'files'"
                    )
        if self.format is not None and self.url is None and self.files is None:
            raise ValueError("format: applies to 'url' or 'files'")
        for path, location in self.locations():
            if not re.match(LOCATION_PATTERN, location):
                raise ValueError(f"{path}: not an absolute local path or an {'/'.join(OBJECT_STORAGE_SCHEMES)} URL")
            if has_parent_segment(location):
                raise ValueError(f"{path}: a location may not contain '..'")
            if "::" in location:
                # fsspec reads "a::b" as a chain of filesystems, each with its own protocol: the
                # scheme this schema and the operator's rules see would not be the one that is read.
                raise ValueError(f"{path}: a location may not chain filesystems ('::')")
        for item in _data_files(self.data_files):
            # Under a Hub id, datasets reads these from the repo; an absolute path or a URL would
            # make it read the host's disk or another store instead (and fails late, at load time).
            if (
                item.startswith(("/", "\\", "~"))
                or "://" in item
                or "::" in item
                or has_parent_segment(item)
                or re.match(r"^[A-Za-z]:", item)
            ):
                raise ValueError(
                    "data_files: a Hub dataset's data_files are paths inside its repo, not "
                    "an absolute path, a URL or '..'"
                )
        return self

    def _check_one_source(self) -> None:
        if len(self.given()) != 1:
            raise ValueError(
                "give exactly one of 'id' (a Hub dataset), 'url' or 'files' (object storage or a "
                "local root) or 'rows' (inline rows)"
            )


def _data_files(value: str | list[str] | dict[str, str | list[str]] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return list(value)
    return [item for entry in value.values() for item in ([entry] if isinstance(entry, str) else entry)]


class MixtureComponent(SourceSpec):
    """One source of a mixture, drawn with its share of the rows."""

    proportion: float = Field(
        gt=0, description="Relative share of this source's rows; the shares are normalised to sum to 1."
    )


class DatasetSpec(SourceSpec):
    """The training rows: one source (see SourceSpec) or a `mixture` of several; an evaluation set
    from `eval_split` of the same source or from a source of its own (`eval`)."""

    max_samples: int | None = Field(None, ge=1, description="Use at most this many rows of the training split.")
    eval_split: str | None = Field(None, description="A split of the same dataset to evaluate on.")
    eval: SourceSpec | None = Field(None, description="An evaluation set from a source of its own.")
    test_split_size: int | float | None = Field(
        None,
        description=(
            "An eval set carved from the training rows (after a mixture is drawn, before max_samples): this "
            "fraction of them (0 < x < 1), or this many rows (an integer, as datasets' train_test_split reads it; "
            "bounded by max_dataset_rows), chosen by training.seed (42 when unset), the same rows on every attempt; "
            "TRL's DatasetMixtureConfig name."
        ),
    )
    mixture: list[MixtureComponent] | None = Field(
        None, min_length=2, max_length=MAX_MIXTURE_SOURCES, description="Several sources, interleaved by proportion."
    )
    streaming: bool = Field(
        False, description="Read rows as training goes, for sets larger than the disk; needs training.max_steps."
    )

    @field_validator("test_split_size", mode="before")
    @classmethod
    def _fraction_or_count(cls, value: object) -> object:
        # One check, before the type's: a count is a JSON integer (1e6 is a number of the float kind,
        # a fraction far too large, never a million rows), a fraction lies strictly between 0 and 1.
        if value is None or (type(value) is int and value >= 1) or (type(value) is float and 0 < value < 1):
            return value
        raise ValueError(
            f"a fraction of the rows between 0 and 1, or a count of rows (an integer, at least 1); got {value!r}"
        )

    def given(self) -> list[str]:
        return super().given() + (["mixture"] if self.mixture is not None else [])

    def _check_one_source(self) -> None:
        if len(self.given()) != 1:
            raise ValueError(
                "give exactly one of 'id' (a Hub dataset), 'url' or 'files' (object storage or a local root), "
                "'rows' (inline rows) or 'mixture'"
            )
        if sum(x is not None for x in (self.eval, self.eval_split, self.test_split_size)) > 1:
            raise ValueError("give one of 'eval_split', 'eval' and 'test_split_size'")
        if self.test_split_size is not None and self.streaming:
            raise ValueError(
                "test_split_size: a stream has no length to carve a part of; give an eval set as 'eval' or 'eval_split'"
            )
        if self.mixture is not None and self.columns:
            raise ValueError("a mixture's columns are renamed per source ('mixture.N.columns')")

    def sources(self) -> list[tuple[str, SourceSpec]]:
        """(field path, source) of every source the request reads: the training one(s), then eval."""
        found: list[tuple[str, SourceSpec]] = [
            (f"dataset.mixture.{i}", part) for i, part in enumerate(self.mixture or [])
        ] or [("dataset", self)]
        if self.eval is not None:
            found.append(("dataset.eval", self.eval))
        return found
