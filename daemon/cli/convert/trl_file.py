"""A `trl` CLI config file: its mapping, the method it is for, and a request id for its run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from daemon.cli.convert.ledger import UsageError
from schemas.methods import METHODS


def read_trl_config(path: Path) -> dict[str, Any]:
    """The file's mapping, as `trl`'s parser reads it (`yaml.safe_load`)."""
    import yaml  # only this command reads YAML

    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: cannot read it as YAML: {exc}") from exc
    if not isinstance(config, dict) or not all(isinstance(key, str) for key in config):
        raise UsageError(f"{path}: a trl config file is one YAML mapping of option names to values")
    return config


def method_for(path: Path, method: str | None) -> str:
    """--method, else the method the file's name starts with (sft.yaml, dpo-lora.yaml)."""
    known = ", ".join(METHODS)
    if method is not None:
        if method not in METHODS:
            raise UsageError(f"unknown method {method!r}; known methods: {known}")
        return method
    stem = path.name.split(".")[0]
    first = re.split(r"[-_]", stem)[0]
    for candidate in (stem, first):
        if candidate in METHODS:
            return candidate
    raise UsageError(f"{path.name} does not name a method; give --method ({known})")


def default_request_id(path: Path, now: str) -> str:
    """The file's stem and the time: a new run each conversion (the same id would be answered as a duplicate)."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.name.split(".")[0]).strip("-.") or "trl"
    return f"{stem[:100]}-{now}"
