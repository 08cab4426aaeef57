"""The ledger of one conversion: the file's keys, the request built from them, and where each key
went (carried, with the request path it went to; carried under the name TRL gives it now; left out,
with why; or an error), so that every key of the input ends in exactly one of them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from daemon.errors import UsageError
from schemas import FieldError, RequestBase
from schemas.contract_rules import refusal

__all__ = ["Changed", "Conversion", "Dropped", "Ledger", "Noted", "Renamed", "UsageError", "refused", "same_value"]


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


@dataclass(frozen=True)
class Noted:
    """A part of a key of the file with a line of its own: what it was carried as (one of
    `reward_funcs`' names, as the reward function adapterd ships for it), or why it was not."""

    key: str
    how: str

    def line(self) -> str:
        return f"{self.key}: {self.how}"


@dataclass
class Conversion:
    """The request (validated; None when it is not valid), the keys carried under a new name, the
    keys carried with a change of meaning, the keys left out, and why the request is not valid."""

    request: RequestBase | None = None
    renamed: list[Renamed] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    errors: list[FieldError] = field(default_factory=list)
    changed: list[Changed] = field(default_factory=list)
    carried: dict[str, list[str]] = field(default_factory=dict)  # key of the file → the request paths it went to
    defaulted: dict[str, Any] = field(default_factory=dict)  # key of the file → its value, TRL's default
    misspelled: dict[str, str] = field(default_factory=dict)  # key of the file → why it is an error (the key it meant)
    noted: list[Noted] = field(default_factory=list)

    def lines(self, keys: list[str]) -> list[str]:
        """The ledger: a line for each key of the file (`keys`, in its order), saying where it went:
        carried (to which request paths), carried under a new name, carried with a change of
        meaning, left at TRL's default, or left out with why. A key that only shapes others (use_peft
        decides `peft`) is said to be read. Then what the file leaves out but a default of its script
        puts in (open-r1's reward_funcs), noted."""
        said: dict[str, list[str]] = {}
        entries: list[Renamed | Changed | Dropped | Noted] = [*self.renamed, *self.changed, *self.noted, *self.dropped]
        for entry in entries:
            key = entry.old if isinstance(entry, Renamed) else entry.key
            said.setdefault(key.split(".")[0], []).append(entry.line())
        lines = []
        for key in keys:
            if key in said:
                lines += said[key]
            elif key in self.carried:
                lines.append(f"{key}: carried to {', '.join(self.carried[key])}")
            elif key in self.misspelled:  # the same words as its error, not "read"
                lines.append(f"{key}: not carried: {self.misspelled[key]}")
            elif key in self.defaulted:
                lines.append(f"{key}: left at TRL's default ({self.defaulted[key]!r}), which the job gets too")
            else:
                lines.append(f"{key}: read: it decides how the keys beside it are carried")
        return lines + [entry.line() for entry in self.noted if entry.key.split(".")[0] not in keys]


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


def refused(block: str, field: str, key: str | None = None) -> str:
    """The refusal table's reason for a block's field, said of the file's key: "set by the daemon: ..."."""
    why = refusal(block, field)
    assert why is not None, f"{block}.{field} is not in the refusal table"
    return why.message(key or field).split(": ", 1)[1]


class Ledger:
    """The file's mapping, the request being built, and the account of every key."""

    def __init__(self, config: dict[str, Any], request: dict[str, Any]) -> None:
        self.config = config
        self.request = request
        self.origin: dict[str, str] = {}  # request path → the key of the file it came from
        self.renamed: list[Renamed] = []
        self.changed: list[Changed] = []
        self.dropped: list[Dropped] = []
        self.noted: list[Noted] = []
        self.errors: list[FieldError] = []
        self.taken: set[str] = set()
        self.defaulted: dict[str, Any] = {}  # keys left out because their value is TRL's default
        self.misspelled: dict[str, str] = {}  # keys that look like a typo of a known one: why, naming it

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
        elif key in self.config:
            self.defaulted[key] = self.config[key]

    def error(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path=path, message=message))
