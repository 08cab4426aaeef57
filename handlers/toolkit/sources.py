"""Reading one dataset source in the child: a Hub dataset, files in object storage (fsspec), files
under a local root the operator allows, or inline rows; each with what it resolved to (provenance).

A Hub id is read from the Hub only: `datasets.load_dataset("org/ds")` would read a folder `org/ds`
in the working directory instead, so the child runs in its job folder and a Hub id that names
something there is refused rather than read. Files are listed here (globs and folders expanded,
sizes and ETags taken) and handed to datasets' own builders as a fixed list.
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, TypeAlias

import fsspec
from datasets import Dataset, IterableDataset, load_dataset
from huggingface_hub import HfApi

from handlers.protocol import JobFailed, JobSpec
from schemas.dataset import SourceSpec
from schemas.locations import within
from schemas.provenance import ResolvedSource, SourceFile

# datasets' builder for each format; json reads JSON Lines too.
BUILDERS = {"json": "json", "jsonl": "json", "parquet": "parquet", "csv": "csv", "arrow": "arrow"}
EXTENSIONS = {
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
    ".parquet": "parquet",
    ".csv": "csv",
    ".arrow": "arrow",
}
GLOB = re.compile(r"[*?\[]")

AnyDataset: TypeAlias = Dataset | IterableDataset


def load_source(
    source: SourceSpec, split: str, role: str, job: JobSpec, *, streaming: bool, field: str
) -> tuple[AnyDataset, ResolvedSource]:
    """One split of one source, and what it resolved to. `field` names the source in errors."""
    if source.rows is not None:
        rows = Dataset.from_list(list(source.rows))
        return (rows.to_iterable_dataset() if streaming else rows), ResolvedSource(
            role=role, kind="inline", location="inline rows"
        )
    if source.id is not None:
        return _hub(source, split, role, streaming, field, job.max_dataset_bytes)
    locations = source.files.get(split) if source.files is not None else source.url
    if locations is None:
        raise JobFailed(
            "dataset_unavailable",
            "load_dataset",
            f"{field}.files: no split {split!r} (has {sorted(source.files or {})})",
        )
    items = [locations] if isinstance(locations, str) else list(locations)
    files: list[SourceFile] = []
    for location in items:
        files += _expand(location, source.format, job, field)
    if not files:
        raise JobFailed("dataset_unavailable", "load_dataset", f"{field}: no data files at {items}")
    if not streaming:  # a stream is read as training goes, never downloaded whole
        check_download_size(
            field, ", ".join(items), [f.size for f in files], job.max_dataset_bytes, "max_dataset_bytes"
        )
    builder = _builder(source, files, field)
    remote = "://" in items[0]
    scheme = items[0].split("://", 1)[0] if remote else None
    options = dict(job.storage_options.get(scheme, {})) if scheme else None
    dataset = load_dataset(
        builder, data_files={split: [f.path for f in files]}, split=split, streaming=streaming, storage_options=options
    )
    kind = "object_storage" if remote else "local"
    return dataset, ResolvedSource(role=role, kind=kind, location=", ".join(items), split=split, files=files)


def _hub(
    source: SourceSpec, split: str, role: str, streaming: bool, field: str, max_bytes: int | None
) -> tuple[AnyDataset, ResolvedSource]:
    assert source.id is not None
    for shadow in (Path(source.id), Path(f"{source.id}.py")):
        if shadow.exists():
            raise JobFailed(
                "dataset_unavailable",
                "load_dataset",
                f"{field}.id: {source.id} also names a local path in the job's folder; a "
                "Hub id is read from the Hub only",
            )
    info = HfApi().dataset_info(source.id, revision=source.revision, files_metadata=True)
    if not streaming:
        check_download_size(
            f"{field}.id", source.id, [s.size for s in info.siblings or []], max_bytes, "max_dataset_bytes"
        )
    dataset = load_dataset(
        source.id, source.config, split=split, revision=info.sha, data_files=source.data_files, streaming=streaming
    )
    files = [SourceFile(path=s.rfilename, size=s.size) for s in info.siblings or [] if not s.rfilename.startswith(".")]
    return dataset, ResolvedSource(
        role=role, kind="hub", location=source.id, revision=info.sha, split=split, files=files
    )


def _expand(location: str, fmt: str | None, job: JobSpec, field: str) -> list[SourceFile]:
    """The files a location names (a file, a glob, or a folder: every file of the format in it)."""
    if "::" in location:  # intake refuses a chain; a file is never opened through one
        raise JobFailed(
            "dataset_unavailable", "load_dataset", f"{field}: {location}: a location may not chain filesystems ('::')"
        )
    protocol, _ = fsspec.core.split_protocol(location)  # fsspec's own reading of the scheme, which is what it opens
    scheme = protocol or "file"
    fs, path = fsspec.core.url_to_fs(location, **job.storage_options.get(scheme, {}))
    if GLOB.search(path):
        paths = sorted(fs.glob(path))
    elif fs.isdir(path):
        paths = sorted(
            p
            for p in fs.find(path)
            if Path(p).suffix in EXTENSIONS and (fmt is None or BUILDERS[EXTENSIONS[Path(p).suffix]] == BUILDERS[fmt])
        )
    else:
        paths = [path]
    found = []
    for item in paths:
        info: dict[str, Any] = fs.info(item)
        if info.get("type") == "directory":
            continue
        if scheme == "file":
            _check_local(item, job, field)
            found.append(SourceFile(path=item, size=info.get("size")))
        else:
            etag = info.get("ETag") or info.get("etag") or info.get("md5Hash")
            version = info.get("VersionId") or info.get("version_id") or info.get("generation")
            url = f"{scheme}://{item}"  # under the scheme the request named (adlfs would say abfs:// for az://)
            _check_url(url, job, field)
            found.append(
                SourceFile(
                    path=url,
                    size=info.get("size"),
                    etag=str(etag).strip('"') if etag else None,
                    version_id=str(version) if version and version != "null" else None,
                )
            )
    return found


def check_download_size(field: str, what: str, sizes: list[int | None], max_bytes: int | None, setting: str) -> None:
    """Fail (not retried) when the files a source lists add up to more than the operator's bound."""
    total = sum(size or 0 for size in sizes)
    if max_bytes is not None and total > max_bytes:
        raise JobFailed(
            "download_too_large",
            "load_model" if setting == "max_model_bytes" else "load_dataset",
            f"{field}: {what} is {total:,} bytes; this host downloads at most {max_bytes:,} ({setting})",
        )


def _check_url(url: str, job: JobSpec, field: str) -> None:
    """Intake matched the location as written; each object a glob or prefix expands to must match
    the operator's allowed_dataset_urls too (`**` or a wildcard can reach further than it reads)."""
    if not any(fnmatchcase(url, pattern) for pattern in job.allowed_dataset_urls):
        raise JobFailed(
            "dataset_unavailable", "load_dataset", f"{field}: {url} is not allowed on this host (allowed_dataset_urls)"
        )


def _check_local(path: str, job: JobSpec, field: str) -> None:
    """Intake checked the path as written; a symlink in the tree could still point elsewhere."""
    if not within(path, job.allowed_local_dataset_roots):
        raise JobFailed(
            "dataset_unavailable", "load_dataset", f"{field}: {path} resolves outside allowed_local_dataset_roots"
        )


def _builder(source: SourceSpec, files: list[SourceFile], field: str) -> str:
    if source.format is not None:
        return BUILDERS[source.format]
    kinds = {EXTENSIONS.get(Path(f.path.split("?")[0]).suffix) for f in files}
    if len(kinds) != 1 or None in kinds:
        raise JobFailed(
            "dataset_invalid",
            "load_dataset",
            f"{field}.format: cannot tell the format from the file names; set format "
            "(json, jsonl, parquet, csv, arrow)",
        )
    return kinds.pop()  # type: ignore[return-value]
