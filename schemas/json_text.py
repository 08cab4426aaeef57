"""A record's text read as JSON, totally (schemas/decode.py reads every request through it): a key given
twice in one object found (the last copy would win silently) and each named by its path; NaN and Infinity
refused; integers past 64 bits, numbers too large to be finite and lone surrogates found as leaves, and
where json.loads itself refuses a number, said where it is.
"""

from __future__ import annotations

import json
import math

from .common import MAX_INT, AdapterdError, FieldError


class _RepeatedKey(AdapterdError):
    """Raised by `_unique_object` at the first JSON object that gives a key twice; `loads` catches it."""


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """The decoder's object_pairs_hook: a dict as json.loads makes one, unless a key came twice."""
    made = dict(pairs)
    if len(made) != len(pairs):
        raise _RepeatedKey
    return made


def loads(text: str) -> tuple[object, bool]:
    """The document, and whether an object of it gives a key twice. Most messages repeat none and
    are parsed once, by `_DECODER`; one that does is parsed again with each such object marked,
    for `repeated_keys` to name them all by their paths."""
    if text.startswith("\ufeff"):  # as json.loads refuses it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        return _DECODER.decode(text), False
    except _RepeatedKey:
        repeated: list[_Repeated] = []
        document = json.loads(
            text, parse_constant=_no_constant, object_pairs_hook=lambda pairs: _object(pairs, repeated)
        )
        return document, bool(repeated)


class _Repeated(dict[str, object]):
    """A JSON object that held a key more than once: the keys it repeated."""

    keys_repeated: list[str]


def _object(pairs: list[tuple[str, object]], repeated: list[_Repeated]) -> dict[str, object]:
    """The object_pairs_hook of a message known to repeat a key: a dict as json.loads makes one,
    marked (and noted in `repeated`) when a key came twice."""
    made = dict(pairs)
    if len(made) == len(pairs):
        return made
    marked = _Repeated(made)
    counts: dict[str, int] = {}
    for key, _ in pairs:
        counts[key] = counts.get(key, 0) + 1
    marked.keys_repeated = sorted(key for key, count in counts.items() if count > 1)
    repeated.append(marked)
    return marked


def repeated_keys(document: object, path: str = "", found: list[FieldError] | None = None) -> list[FieldError]:
    """Each key a JSON object of the document held more than once, by its path (at most ten)."""
    found = [] if found is None else found
    if isinstance(document, _Repeated):
        for name in document.keys_repeated:
            found.append(
                FieldError(
                    path=f"{path}.{name}" if path else name,
                    message="given more than once in one JSON object; a key may appear once "
                    "(the copies would not all be read)",
                )
            )
    children: list[tuple[object, object]] = (
        list(document.items())
        if isinstance(document, dict)
        else list(enumerate(document))
        if isinstance(document, list)
        else []
    )
    for key, value in children:
        if len(found) >= 10:
            break
        repeated_keys(value, f"{path}.{key}" if path else str(key), found)
    return found[:10]


# What a leaf the walk below refuses needs to show in the text: a run of 19 digits (a 64-bit bound
# needs that many), an exponent of three digits (1e400 reads as inf), or an escaped surrogate
# (\ud800; the text itself is strict UTF-8, so a lone surrogate can only come from an escape).
# Most messages have none of these and skip the walk. Searched on the raw bytes, in the secret
# scan's pass over them (`SecretScanner.screen_with`).
SUSPECT_LEAF = rb"\d{19}|[eE][+-]?\d{3}|\\u[dD][89a-fA-F]"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


# Built once, as json.loads builds its default decoder once: json.loads with any argument builds a
# decoder and its scanner on every call (1.8 us a message, more than the hook it passes). Threads of
# the decode pool share it as json.loads' callers share the default one: its scanner keeps nothing
# between documents but a memo of key strings, which it clears after each.
_DECODER = json.JSONDecoder(parse_constant=_no_constant, object_pairs_hook=_unique_object)


def leaf_problems(document: object, path: str = "", found: list[FieldError] | None = None) -> list[FieldError]:
    """The leaves no request may hold, wherever they are: integers beyond 64 bits, numbers that are
    not finite, and strings (or keys) that are not encodable as UTF-8 (lone surrogates). At most ten."""
    found = [] if found is None else found
    if len(found) >= 10:
        return found
    if isinstance(document, str):
        if not encodable(document):
            found.append(FieldError(path=path, message="not valid Unicode: holds a lone surrogate (\\ud800-\\udfff)"))
    elif isinstance(document, bool):
        pass
    elif isinstance(document, int):
        if not -MAX_INT - 1 <= document <= MAX_INT:
            found.append(
                FieldError(
                    path=path, message=f"an integer of {len(str(abs(document)))} digits; at most 64 bits ({MAX_INT})"
                )
            )
    elif isinstance(document, float):
        if not math.isfinite(document):
            found.append(FieldError(path=path, message="a number too large to be finite"))
    elif isinstance(document, dict):
        for key, value in document.items():
            if not encodable(key):
                found.append(
                    FieldError(
                        path=f"{path}.<key>" if path else "<key>",
                        message="a key that is not valid Unicode (a lone surrogate)",
                    )
                )
                continue
            leaf_problems(value, f"{path}.{key}" if path else key, found)
    elif isinstance(document, list):
        for index, item in enumerate(document):
            leaf_problems(item, f"{path}.{index}" if path else str(index), found)
    return found


def encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Digits(str):
    """An integer literal kept as its text, to find where an unreadable one is."""


def unreadable_numbers(text: str) -> tuple[list[FieldError], object]:
    """Where the numbers are that json.loads refused (an integer past Python's digit limit, NaN,
    Infinity): the text parsed again with integers and constants kept as text (and the document,
    for its request id)."""
    try:
        document = json.loads(text, parse_int=_Digits, parse_constant=_Digits)
    except (ValueError, RecursionError) as exc:
        return [FieldError(path="", message=f"a number no request may hold: {str(exc)[:200]}")], None
    found: list[FieldError] = []

    def walk(node: object, path: str) -> None:
        if isinstance(node, _Digits) and (not node.lstrip("-").isdigit() or len(node.lstrip("-")) > 19):
            shown = node if not node.lstrip("-").isdigit() else f"an integer of {len(node.lstrip('-'))} digits"
            found.append(
                FieldError(
                    path=path,
                    message=f"{shown}: not a number a request may hold (integers fit in 64 bits, numbers are finite)",
                )
            )
        elif isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{path}.{key}" if path else key)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                walk(item, f"{path}.{index}" if path else str(index))

    try:
        walk(document, "")
    except RecursionError:
        pass
    return found[:10] or [FieldError(path="", message="a number no request may hold")], document
