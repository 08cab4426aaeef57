"""Read the request's contract out of the installed TRL, transformers and PEFT: for each block of a
request, the dataclass it mirrors, and for each field its type, default, allowed values and help.

The result is plain JSON (schemas/trl_contract.json when written by `python -m
handlers.contract.generate_contract`); rendering it into pydantic models and docs needs no TRL
(handlers/contract/contract_render.py). The drift test compares this reading with the checked-in file.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
import re
import types
import typing
import warnings
from importlib.metadata import version
from typing import Any

from schemas.contract_rules import (
    BLOCK_SOURCES,
    CHOICES,
    HELP_CHOICES,
    MODEL_CONFIG_PATHS,
    SHARED_BLOCKS,
)

_NONE = type(None)


def dataclass_of(source: str) -> type | None:
    """The class at a dotted path, or None where this install does not have it (PPO after trl 1.12)."""
    module, _, name = source.rpartition(".")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # trl.experimental warns on import
        try:
            return getattr(importlib.import_module(module), name)  # a class named by its path in TRL's install
        except (ImportError, AttributeError):
            return None


def type_text(hint: Any) -> tuple[str, bool, list[Any] | None, str | None]:
    """A dataclass annotation as (pydantic type text, whether None is allowed, the allowed values
    when the type states them, the dotted name of a nested config class written as a JSON object)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not _NONE]
        nullable = len(members) < len(args)
        enums = [m for m in members if isinstance(m, type) and issubclass(m, enum.Enum)]
        if enums:  # "SchedulerType | str": the enum's values are the allowed strings
            return "str", nullable, [e.value for e in enums[0]], None
        parts = [type_text(m) for m in members]
        literals = [p for p in parts if p[2] is not None and p[0] != "str"]
        objects = [p[3] for p in parts if p[3]]
        text = " | ".join(
            sorted({p[0] for p in parts})
        )  # sorted: typing caches a Union in whichever order it first met it
        return (
            text,
            nullable or any(p[1] for p in parts),
            (literals[0][2] if len(parts) == 1 and literals else None),
            (objects[0] if objects else None),
        )
    if origin is typing.Literal:
        values = list(args)
        return " | ".join(sorted({type(v).__name__ for v in values})), False, values, None
    if origin in (list, tuple, dict) or hint in (list, tuple, dict):
        if origin is dict or hint is dict:
            return "dict[str, Any]", False, None, None
        inner = [type_text(a)[0] for a in args if a is not Ellipsis] or ["Any"]
        if origin is tuple:
            return f"tuple[{', '.join(inner)}]", False, None, None
        item = typing.get_args(hint)[0] if args else Any
        if isinstance(item, type) and issubclass(item, enum.Enum):
            return "list[str]", False, [e.value for e in item], None
        return f"list[{inner[0]}]", False, None, None
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "str", False, [e.value for e in hint], None
    if hint in (bool, int, float, str):
        return hint.__name__, False, None, None
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return "dict[str, Any]", False, None, f"{hint.__module__}.{hint.__qualname__}"
    return "Any", False, None, None


def default_of(field: dataclasses.Field[Any]) -> Any:
    value = field.default
    if value is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    if value is dataclasses.MISSING:
        return None
    if isinstance(value, enum.Enum):
        return value.value
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def help_choices(help_text: str) -> list[str]:
    """The values listed by the sentence of a help text that introduces them ("Supported values are
    'a', 'b'." or "Possible values are: `a` (default), `b`."): its 'quoted' values, else its `backticked` ones."""
    match = re.search(r"(?:values are|Must be one of|Options:)(.*?)(?:\.\s|\.$|$)", help_text, re.S)
    if not match:
        return []
    values = re.findall(r"'([a-z][a-z0-9_]*)'", match.group(1)) or re.findall(r"`([a-z][a-z0-9_]*)`", match.group(1))
    return list(dict.fromkeys(values))


def read_fields(cls: type, block: str, exclude: set[str]) -> dict[str, dict[str, Any]]:
    hints = typing.get_type_hints(cls)
    fields = {}
    for field in dataclasses.fields(cls):
        if field.name in exclude or field.name.startswith("_"):
            continue
        text, nullable, choices, nested = type_text(hints[field.name])
        help_text = " ".join(str(field.metadata.get("help", "")).split())
        if "choices" in field.metadata:
            choices = list(field.metadata["choices"])
        if field.name in HELP_CHOICES.get(block, ()):
            choices = help_choices(help_text) or None
        if field.name in CHOICES.get(block, {}):
            choices = list(CHOICES[block][field.name])
        fields[field.name] = {
            "type": text,
            "nullable": nullable or field.default is None,
            "default": default_of(field),
            "choices": choices,
            "object": nested,
            "help": help_text,
        }
    return fields


def read_contract(blocks: typing.Iterable[str] = BLOCK_SOURCES) -> dict[str, Any]:
    """Every block this install can read, as {block: {source, package, version, fields, training_defaults}}."""
    training = dataclass_of(BLOCK_SOURCES["training"])
    assert training is not None, "transformers.TrainingArguments is always there: transformers is a dependency"
    training_fields = {f.name: default_of(f) for f in dataclasses.fields(training)}
    contract = {}
    for block in blocks:
        source = BLOCK_SOURCES[block]
        cls = dataclass_of(source)
        if cls is None:
            continue
        package = source.split(".")[0]
        if block in ("training", "peft"):
            exclude: set[str] = set()
        elif block == "model":
            exclude = set(MODEL_CONFIG_PATHS)
        else:
            exclude = set(training_fields)
        section: dict[str, Any] = {
            "source": source,
            "package": package,
            "version": version(package),
            "fields": read_fields(cls, block, exclude),
        }
        if block not in SHARED_BLOCKS:  # where the method's config changes a training default
            section["training_defaults"] = {
                f.name: default_of(f)
                for f in dataclasses.fields(cls)
                if f.name in training_fields and default_of(f) != training_fields[f.name]
            }
        contract[block] = section
    return contract
