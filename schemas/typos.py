"""The "did you mean" of a misspelt name: the known field (or setting, or key) closest to an unknown one.

One cutoff and one walk for every such message: a request's unknown field (schemas/decode.py), an
unknown key in the daemon's settings file (daemon/settings/), a TRL config file's unknown key
(daemon/cli/convert/trl_config.py).
"""

from __future__ import annotations

import difflib
import inspect
import types
import typing
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel
from pydantic.fields import FieldInfo

# How close an unknown key must be to a known one to be taken for its typo (difflib's ratio):
# learning_rat is 0.96 from learning_rate; max_sequence_len, 0.54 from max_length, is not one.
TYPO_CUTOFF = 0.85


def closest(name: str, known: Iterable[str]) -> str | None:
    """The known name `name` is most likely a typo of, if one is close enough."""
    meant = difflib.get_close_matches(name, list(known), n=1, cutoff=TYPO_CUTOFF)
    return meant[0] if meant else None


def meant_field(model: type[BaseModel], loc: Sequence[int | str]) -> str | None:
    """For pydantic's `extra_forbidden` error at `loc` (the unknown key last) in a validation of
    `model`: the field of the model at that place closest to the key; None when none is close or
    the place cannot be told (a free-form dict, a union pydantic did not name the member of)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    place = _model_at(model, tuple(loc[:-1]))
    return closest(loc[-1], place.model_fields) if place is not None else None


def _model_at(annotation: Any, loc: tuple[int | str, ...], discriminator: str | None = None) -> type[BaseModel] | None:
    """The model class at `loc` inside a value of type `annotation`, following pydantic's error
    locations: a model's field by name, a list's or tuple's item by index, a dict's value by key, a
    discriminated union's member by its tag (pydantic puts the tag into the location)."""
    while typing.get_origin(annotation) is Annotated:  # a discriminated union's Field(discriminator=...)
        annotation, *metadata = typing.get_args(annotation)
        for meta in metadata:
            if isinstance(meta, FieldInfo) and isinstance(meta.discriminator, str):
                discriminator = meta.discriminator
    origin = typing.get_origin(annotation)
    if origin is Union or origin is types.UnionType:
        members = [member for member in typing.get_args(annotation) if member is not type(None)]
        if len(members) == 1:  # an Optional: pydantic leaves None out of the location
            return _model_at(members[0], loc, discriminator)
        if not loc:
            return None
        head, rest = loc[0], loc[1:]
        for member in members:
            if discriminator is not None and head in _tags(member, discriminator):
                return _model_at(member, rest)
            if discriminator is None and inspect.isclass(member) and member.__name__ == head:
                return _model_at(member, rest)  # a plain union of models names the member it tried
        return None
    if not loc:
        return annotation if inspect.isclass(annotation) and issubclass(annotation, BaseModel) else None
    head, rest = loc[0], loc[1:]
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        field = annotation.model_fields.get(head) if isinstance(head, str) else None
        if field is None:
            return None
        return _model_at(field.annotation, rest, field.discriminator if isinstance(field.discriminator, str) else None)
    arguments = typing.get_args(annotation)
    if inspect.isclass(origin) and issubclass(origin, Mapping) and len(arguments) == 2:
        return _model_at(arguments[1], rest)
    if inspect.isclass(origin) and issubclass(origin, Collection) and isinstance(head, int) and arguments:
        if origin is tuple and not (len(arguments) == 2 and arguments[1] is Ellipsis):
            return _model_at(arguments[head], rest) if 0 <= head < len(arguments) else None
        return _model_at(arguments[0], rest)
    return None


def _tags(member: Any, discriminator: str) -> tuple[object, ...]:
    """The values of a discriminated union member's tag field (its Literal's)."""
    if not (inspect.isclass(member) and issubclass(member, BaseModel)) or discriminator not in member.model_fields:
        return ()
    tag = member.model_fields[discriminator].annotation
    return typing.get_args(tag) if typing.get_origin(tag) is Literal else ()
