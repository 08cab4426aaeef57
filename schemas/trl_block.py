"""The base of the request's generated TRL blocks (schemas/trl_fields.py): it refuses a field the
rules say a request may not set, naming the TRL (or transformers, or PEFT) field and the reason;
accepts a renamed field under its old name; and hands TRL only what the request set.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import SerializerFunctionWrapHandler, model_serializer, model_validator

from .common import Frozen
from .contract_rules import BLOCK_SOURCES, RENAMED, refusal, refused_names


class TRLBlock(Frozen):
    """One block of TRL (or transformers, or PEFT) config fields, by their own names."""

    block: ClassVar[str]
    # The names this block refuses or renames; most requests set none of them, and a set
    # intersection tells so without a Python loop (intake decodes thousands of requests a second).
    _special: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        if "block" in cls.__dict__:
            cls._special = frozenset(refused_names(cls.block)) | frozenset(RENAMED.get(cls.block, {}))

    @model_validator(mode="before")
    @classmethod
    def _refused_and_renamed(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not cls._special.intersection(data):
            return data
        for name in data:
            if (why := refusal(cls.block, name)) is not None:
                raise ValueError(why.message(name, source=BLOCK_SOURCES[cls.block]))
        renamed = RENAMED.get(cls.block, {})
        return {renamed.get(name, name): value for name, value in data.items()}

    @model_serializer(mode="wrap")
    def _what_was_set(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Serialised, a block holds what the request set and adapterd's defaults, never the unset
        fields' None: it reads back the same (a null `max_length` stays set; an unset `max_steps` stays unset)."""
        values = handler(self)
        return {name: value for name, value in values.items() if value is not None or name in self.model_fields_set}

    def set_fields(self) -> dict[str, Any]:
        """The fields to pass on as keyword arguments: those the request set, and those with an
        adapterd default (LoRA's); every other field is left to TRL's own default."""
        return self.model_dump()
