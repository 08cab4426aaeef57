"""The ledger of one conversion: the file's keys, the request built from them, and where each key
went (carried, with the request path it went to; carried under the name TRL gives it now; left out,
with why; or an error), so that every key of the input ends in exactly one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from schemas import FieldError, RequestBase


class UsageError(Exception):
    """The command line or the file cannot be used at all (exit 2)."""


@dataclass(frozen=True)
class Dropped:
    """A key of the file the request does not carry, and why."""

    key: str
    why: str

    def line(self) -> str:
        return f"{self.key}: {self.why}"


@dataclass(frozen=True)
class Renamed:
    """A key of the file that TRL or transformers renamed, carried under its new name (trl_renames.py)."""

    old: str
    new: str
    release: str  # the release in which the old name stopped working
    note: str = ""

    def line(self) -> str:
        return f"{self.old}: carried as {self.new} (renamed in {self.release}{'; ' + self.note if self.note else ''})"


@dataclass(frozen=True)
class Changed:
    """A key of the file carried where its meaning is not quite the same in adapterd: said, never silent."""

    key: str
    how: str

    def line(self) -> str:
        return f"{self.key}: carried, but {self.how}"


@dataclass
class Conversion:
    """The request (validated; None when it is not valid), the keys carried under a new name, the
    keys carried with a change of meaning, the keys left out, and why the request is not valid."""

    request: RequestBase | None = None
    renamed: list[Renamed] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    changed: list[Changed] = field(default_factory=list)


def same_value(value: Any, default: Any) -> bool:
    """Whether a value from the file is the default (YAML reads 2e-5 as a string, trl's parser as a float)."""
    if isinstance(default, list) and not isinstance(value, list):
        value = [value]
    if isinstance(value, str) and isinstance(default, int | float) and not isinstance(default, bool):
        try:
            value = float(value)
        except ValueError:
            return False
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return bool(value == default)


class Ledger:
    """The file's mapping, the request being built, and the account of every key."""

    def __init__(self, config: dict[str, Any], request: dict[str, Any]) -> None:
        self.config = config
        self.request = request
        self.origin: dict[str, str] = {}  # request path → the key of the file it came from
        self.renamed: list[Renamed] = []
        self.changed: list[Changed] = []
        self.dropped: list[Dropped] = []
        self.errors: list[FieldError] = []
        self.taken: set[str] = set()

    def has(self, key: str) -> bool:
        return key in self.config

    def get(self, key: str, default: Any = None) -> Any:
        self.taken.add(key)
        return self.config.get(key, default)

    def put(self, path: str, value: Any, key: str) -> None:
        *blocks, name = path.split(".")
        target = self.request
        for block in blocks:
            target = target.setdefault(block, {})
        target[name] = value
        self.origin[path] = key

    def drop(self, key: str, why: str, default: Any = None) -> None:
        """Leave a key out: named with why, unless its value is the default (nothing is lost)."""
        self.taken.add(key)
        if key in self.config and not same_value(self.config[key], default):
            self.dropped.append(Dropped(key, why))

    def error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path=path, message=message))
