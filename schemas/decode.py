"""Turn the raw bytes of a message into a request, or into the reasons it is not one.

Producers can call this before publishing; the daemon calls it on every message it consumes.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import ValidationError

from schemas.common import MAX_INT, REQUEST_ID_PATTERN, AdapterdError, FieldError, RejectReason
from schemas.request import REQUEST_MODELS, RequestBase
from schemas.secrets import BUILTIN, SecretScanner


@dataclass(frozen=True)
class Rejection:
    """Why a message is not a valid request. `request_id` is what could be recovered, if anything."""

    reason: RejectReason
    errors: list[FieldError]
    request_id: str | None = None
    exception: str | None = None  # for reason `internal`: the class of what was raised

    def bounded(self) -> Rejection:
        """The same rejection fit to travel: at most 50 errors, each path and message cut to a bound
        and any character UTF-8 cannot carry escaped, so that its event and DLQ headers always
        serialise and stay far below the broker's message size, whatever the request held."""
        if len(self.errors) <= 50 and all(_fits(error.path, 256) and _fits(error.message, 1000) for error in self.errors):
            return self  # the common case: nothing to cut
        errors = [FieldError(path=_fit(error.path, 256), message=_fit(error.message, 1000)) for error in self.errors[:50]]
        if len(self.errors) > 50:
            errors.append(FieldError(path="", message=f"and {len(self.errors) - 50} more errors"))
        return Rejection(self.reason, errors, self.request_id, self.exception)


def _fits(text: str, limit: int) -> bool:
    return len(text) <= limit and (text.isascii() or _encodable(text))


def _fit(text: str, limit: int) -> str:
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")  # a lone surrogate becomes \\udfff
    return text if len(text) <= limit else text[: limit - 3] + "..."


# The fields whose value picks a member of a discriminated union (an evaluation suite's `kind`, a
# reward function's `name`); pydantic puts that value into an error's location.
_TAGS = ("kind", "name", "type")


def _path(loc: tuple[int | str, ...], document: object = None) -> str:
    """An error's location as the request's own field path: a discriminated union's tag, which
    pydantic adds (`evaluation.suites.0.task.source`, the suite's kind 'task' before its field), is
    left out, so the path names the request's fields and nothing else."""
    parts: list[str] = []
    node = document
    for index, part in enumerate(loc):
        following = loc[index + 1] if index + 1 < len(loc) else None
        if isinstance(node, dict) and isinstance(part, str) and part in {node.get(tag) for tag in _TAGS} and (part not in node or following in node):
            continue  # the tag; a tag that is also a field's name ('task') is the tag when the next part is a field of this node
        parts.append(str(part))
        if isinstance(node, dict) and isinstance(part, str):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return ".".join(parts)


def _message(error: dict[str, object]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field; not part of schema version 1 (check the spelling)"
    return str(error["msg"])


# Checks that span several fields run on the whole request; they name their field first ("dataset.columns: ...").
_NAMED_FIELD = re.compile(r"^Value error, ([A-Za-z_][\w.]*): (.*)$", re.DOTALL)
# Compiled once: every message's key and request_id are matched against it, and re.fullmatch with
# a pattern string looks the pattern up in re's cache each call (0.5 us against 0.15).
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def field_errors(exc: ValidationError, document: object = None) -> list[FieldError]:
    """Each error of a validation, by the field it concerns (`document`: the request validated, to
    tell its fields from what pydantic adds to a location)."""
    errors = []
    for error in exc.errors():
        path, message = _path(tuple(error["loc"]), document), _message(dict(error))
        named = _NAMED_FIELD.match(message)
        if named:  # a check on a block names its field inside the block: "dataset" + "data_files"
            path, message = (f"{path}.{named.group(1)}" if path else named.group(1)), named.group(2)
        errors.append(FieldError(path=path, message=message))
    return errors


def decode_request(raw: bytes | None, key: bytes | None = None, *, scanner: SecretScanner = BUILTIN) -> RequestBase | Rejection:
    """Decode and validate one message. Never raises for bad input: it returns a `Rejection`.
    Strict: a key given twice in an object is refused, and no value is coerced to a field's type.
    `scanner`: the credential rules (the built-in ones; the daemon passes its larger set)."""
    # The record key's id, worked out only where the document has none (a scan of it costs).
    def key_id() -> str | None:
        return _request_id_from_key(key, scanner)

    try:
        # Strict UTF-8 first: json.loads of bytes would also take UTF-16 and UTF-8-encoded surrogates.
        text = (raw or b"").decode("utf-8")
        document, repeated = _loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Rejection("not_json", [FieldError(path="", message=f"not UTF-8 JSON: {exc}")], key_id())
    except RecursionError:
        return Rejection("not_json", [FieldError(path="", message="JSON nested too deeply to be a request")], key_id())
    except ValueError:  # an integer of more digits than Python converts, or NaN / Infinity
        errors, document = _unreadable_numbers(text)
        return Rejection("invalid", errors, _request_id_of(document, key_id))
    if repeated:  # the last copy would win silently, and the scan and the job would see only it
        return Rejection("invalid", _repeated_keys(document), _unsecret_request_id(document, key_id, scanner))
    try:
        shapes, keys, suspect = scanner.screen_with(raw or b"", SUSPECT_LEAF)  # one pass of RE2 for the three
        problems = leaf_problems(document) if suspect else []
        secrets = [] if problems else _by_path(
            (scanner.find(document) if shapes else []) + scanner.in_metadata(document)
            + scanner.under_credential_keys(document, raw or b"", screened=keys))
    except RecursionError:  # json.loads nests deeper than a walk in Python can follow
        return Rejection("not_json", [FieldError(path="", message="JSON nested too deeply to be a request")], key_id())
    if problems:
        return Rejection("invalid", problems, _request_id_of(document, key_id))
    if secrets:
        # The paths and kinds only: the values stay out of the event, the DLQ headers and the logs.
        return Rejection("secret_in_request", [
            FieldError(path=path, message=f"looks like {kind}; credentials never go in a request (the daemon uses the host's own)")
            for path, kind in secrets
        ], _unsecret_request_id(document, key_id, scanner))
    if not isinstance(document, dict):
        kind = type(document).__name__
        return Rejection("not_an_object", [FieldError(path="", message=f"a request is a JSON object, got {kind}")], key_id())

    request_id = _request_id_of(document, key_id)
    method = document.get("method")
    if not isinstance(method, str) or method not in REQUEST_MODELS:
        known = ", ".join(sorted(REQUEST_MODELS))
        message = "missing" if method is None else f"unknown method {str(method)[:64]!r}"
        return Rejection("unknown_method", [FieldError(path="method", message=f"{message}; known methods: {known}")], request_id)

    try:
        # Strict: nothing is coerced ("8" is not an integer, true is not one, "no" is not a boolean).
        # On the text, so that strict still reads a JSON array as a tuple and a string as a Literal.
        return REQUEST_MODELS[method].model_validate_json(text, strict=True)
    except ValidationError as exc:
        return Rejection("invalid", field_errors(exc, document), request_id)
    except RecursionError:
        return Rejection("invalid", [FieldError(path="", message="nested too deeply to validate")], request_id)


def _by_path(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One finding a path, the first: a token's shape under `hf_token` says more than the key's name."""
    first: dict[str, str] = {}
    for path, kind in found:
        first.setdefault(path, kind)
    return list(first.items())


class _RepeatedKey(AdapterdError):
    """Raised by `_unique_object` at the first JSON object that gives a key twice; `_loads` catches it."""


def _unique_object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """The decoder's object_pairs_hook: a dict as json.loads makes one, unless a key came twice."""
    made = dict(pairs)
    if len(made) != len(pairs):
        raise _RepeatedKey
    return made


def _loads(text: str) -> tuple[object, bool]:
    """The document, and whether an object of it gives a key twice. Most messages repeat none and
    are parsed once, by `_DECODER`; one that does is parsed again with each such object marked,
    for `_repeated_keys` to name them all by their paths."""
    if text.startswith("\ufeff"):  # as json.loads refuses it
        raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    try:
        return _DECODER.decode(text), False
    except _RepeatedKey:
        repeated: list[_Repeated] = []
        document = json.loads(text, parse_constant=_no_constant, object_pairs_hook=lambda pairs: _object(pairs, repeated))
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


def _repeated_keys(document: object, path: str = "", found: list[FieldError] | None = None) -> list[FieldError]:
    """Each key a JSON object of the document held more than once, by its path (at most ten)."""
    found = [] if found is None else found
    if isinstance(document, _Repeated):
        for name in document.keys_repeated:
            found.append(FieldError(path=f"{path}.{name}" if path else name,
                                    message="given more than once in one JSON object; a key may appear once (the copies would not all be read)"))
    children: list[tuple[object, object]] = (
        list(document.items()) if isinstance(document, dict) else list(enumerate(document)) if isinstance(document, list) else [])
    for key, value in children:
        if len(found) >= 10:
            break
        _repeated_keys(value, f"{path}.{key}" if path else str(key), found)
    return found[:10]


def _unsecret_request_id(document: object, key_id: Callable[[], str | None], scanner: SecretScanner) -> str | None:
    """The request id of a document that may hold a credential: never one that looks like one."""
    request_id = document.get("request_id") if isinstance(document, dict) else None
    return request_id if isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) and not scanner.kind(request_id) else key_id()


def _request_id_of(document: object, key_id: Callable[[], str | None]) -> str | None:
    request_id = document.get("request_id") if isinstance(document, dict) else None
    return request_id if isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) else key_id()


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
        if not _encodable(document):
            found.append(FieldError(path=path, message="not valid Unicode: holds a lone surrogate (\\ud800-\\udfff)"))
    elif isinstance(document, bool):
        pass
    elif isinstance(document, int):
        if not -MAX_INT - 1 <= document <= MAX_INT:
            found.append(FieldError(path=path, message=f"an integer of {len(str(abs(document)))} digits; at most 64 bits ({MAX_INT})"))
    elif isinstance(document, float):
        if not math.isfinite(document):
            found.append(FieldError(path=path, message="a number too large to be finite"))
    elif isinstance(document, dict):
        for key, value in document.items():
            if not _encodable(key):
                found.append(FieldError(path=f"{path}.<key>" if path else "<key>", message="a key that is not valid Unicode (a lone surrogate)"))
                continue
            leaf_problems(value, f"{path}.{key}" if path else key, found)
    elif isinstance(document, list):
        for index, item in enumerate(document):
            leaf_problems(item, f"{path}.{index}" if path else str(index), found)
    return found


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class _Digits(str):
    """An integer literal kept as its text, to find where an unreadable one is."""


def _unreadable_numbers(text: str) -> tuple[list[FieldError], object]:
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
            found.append(FieldError(path=path, message=f"{shown}: not a number a request may hold (integers fit in 64 bits, numbers are finite)"))
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


def _request_id_from_key(key: bytes | None, scanner: SecretScanner) -> str | None:
    try:
        text = (key or b"").decode()
    except UnicodeDecodeError:
        return None
    if not _REQUEST_ID.fullmatch(text):
        return None
    return None if scanner.kind(text) else text
