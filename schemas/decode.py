"""Turn the raw bytes of a message into a request, or into the reasons it is not one.

Producers can call this before publishing; the daemon calls it on every message it consumes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from .common import REQUEST_ID_PATTERN, FieldError, RejectReason
from .json_text import SUSPECT_LEAF, encodable, leaf_problems, loads, repeated_keys, unreadable_numbers
from .request import REQUEST_MODELS, RequestBase
from .secrets import BUILTIN, SecretScanner
from .typos import closest, meant_field


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
        if len(self.errors) <= 50 and all(
            _fits(error.path, 256) and _fits(error.message, 1000) for error in self.errors
        ):
            return self  # the common case: nothing to cut
        errors = [
            FieldError(path=_fit(error.path, 256), message=_fit(error.message, 1000)) for error in self.errors[:50]
        ]
        if len(self.errors) > 50:
            errors.append(FieldError(path="", message=f"and {len(self.errors) - 50} more errors"))
        return Rejection(self.reason, errors, self.request_id, self.exception)


def _fits(text: str, limit: int) -> bool:
    return len(text) <= limit and (text.isascii() or encodable(text))


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
        if (
            isinstance(node, dict)
            and isinstance(part, str)
            and any(node.get(tag) == part for tag in _TAGS)  # a tag's value may be anything a writer sent: a list
            and (part not in node or following in node)
        ):
            # the tag; a tag that is also a field's name ('task') is the tag when the next part is a field of this node
            continue
        parts.append(str(part))
        if isinstance(node, dict) and isinstance(part, str):
            node = node.get(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            node = None
    return ".".join(parts)


def _message(error: dict[str, Any], model: type[BaseModel] | None) -> str:
    if error["type"] == "extra_forbidden":
        meant = meant_field(model, tuple(error["loc"])) if model is not None else None
        hint = f"; did you mean {meant!r}?" if meant else " (check the spelling)"
        return f"unknown field; not part of schema version 1{hint}"
    return str(error["msg"])


# Checks that span several fields run on the whole request; they name their field first ("dataset.columns: ...").
_NAMED_FIELD = re.compile(r"^Value error, ([A-Za-z_][\w.]*): (.*)$", re.DOTALL)
# Compiled once: every message's key and request_id are matched against it, and re.fullmatch with
# a pattern string looks the pattern up in re's cache each call (0.5 us against 0.15).
_REQUEST_ID = re.compile(REQUEST_ID_PATTERN)


def field_errors(
    exc: ValidationError, document: object = None, model: type[BaseModel] | None = None
) -> list[FieldError]:
    """Each error of a validation, by the field it concerns (`document`: the request validated, to
    tell its fields from what pydantic adds to a location; `model`: the class validated, whose
    fields name the one an unknown field is most likely a typo of)."""
    errors = []
    for error in exc.errors():
        path, message = _path(tuple(error["loc"]), document), _message(dict(error), model)
        named = _NAMED_FIELD.match(message)
        if named:  # a check on a block names its field inside the block: "dataset" + "data_files"
            path, message = (f"{path}.{named.group(1)}" if path else named.group(1)), named.group(2)
        errors.append(FieldError(path=path, message=message))
    return errors


def decode_request(
    raw: bytes | None, key: bytes | None = None, *, scanner: SecretScanner = BUILTIN
) -> RequestBase | Rejection:
    """Decode and validate one message. Never raises for bad input: it returns a `Rejection`.
    Strict: a key given twice in an object is refused, and no value is coerced to a field's type.
    `scanner`: the credential rules (the built-in ones; the daemon passes its larger set)."""

    # The record key's id, worked out only where the document has none (a scan of it costs).
    def key_id() -> str | None:
        return _request_id_from_key(key, scanner)

    try:
        # Strict UTF-8 first: json.loads of bytes would also take UTF-16 and UTF-8-encoded surrogates.
        text = (raw or b"").decode("utf-8")
        document, repeated = loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Rejection("not_json", [FieldError(path="", message=f"not UTF-8 JSON: {exc}")], key_id())
    except RecursionError:
        return Rejection("not_json", [FieldError(path="", message="JSON nested too deeply to be a request")], key_id())
    except ValueError:  # an integer of more digits than Python converts, or NaN / Infinity
        errors, document = unreadable_numbers(text)
        return Rejection("invalid", errors, _request_id_of(document, key_id))
    if repeated:  # the last copy would win silently, and the scan and the job would see only it
        return Rejection("invalid", repeated_keys(document), _unsecret_request_id(document, key_id, scanner))
    try:
        shapes, keys, suspect = scanner.screen_with(raw or b"", SUSPECT_LEAF)  # one pass of RE2 for the three
        problems = leaf_problems(document) if suspect else []
        secrets = (
            []
            if problems
            else _by_path(
                (scanner.find(document) if shapes else [])
                + scanner.in_metadata(document)
                + scanner.under_credential_keys(document, raw or b"", screened=keys)
            )
        )
    except RecursionError:  # json.loads nests deeper than a walk in Python can follow
        return Rejection("not_json", [FieldError(path="", message="JSON nested too deeply to be a request")], key_id())
    if problems:
        return Rejection("invalid", problems, _request_id_of(document, key_id))
    if secrets:
        # The paths and kinds only: the values stay out of the event, the DLQ headers and the logs.
        return Rejection(
            "secret_in_request",
            [
                FieldError(
                    path=path,
                    message=f"looks like {kind}; credentials never go in a request (the daemon uses the host's own)",
                )
                for path, kind in secrets
            ],
            _unsecret_request_id(document, key_id, scanner),
        )
    if not isinstance(document, dict):
        kind = type(document).__name__
        return Rejection(
            "not_an_object", [FieldError(path="", message=f"a request is a JSON object, got {kind}")], key_id()
        )

    request_id = _request_id_of(document, key_id)
    method = document.get("method")
    if not isinstance(method, str) or method not in REQUEST_MODELS:
        known = ", ".join(sorted(REQUEST_MODELS))
        message = "missing" if method is None else f"unknown method {str(method)[:64]!r}"
        if method is None and (typo := next((key for key in document if closest(key, ["method"])), None)):
            message += f" (did you mean 'method' for {typo[:64]!r}?)"
        return Rejection(
            "unknown_method", [FieldError(path="method", message=f"{message}; known methods: {known}")], request_id
        )

    try:
        # Strict: nothing is coerced ("8" is not an integer, true is not one, "no" is not a boolean).
        # On the text, so that strict still reads a JSON array as a tuple and a string as a Literal.
        return REQUEST_MODELS[method].model_validate_json(text, strict=True)
    except ValidationError as exc:
        return Rejection("invalid", field_errors(exc, document, REQUEST_MODELS[method]), request_id)
    except RecursionError:
        return Rejection("invalid", [FieldError(path="", message="nested too deeply to validate")], request_id)


def _by_path(found: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """One finding a path, the first: a token's shape under `hf_token` says more than the key's name."""
    first: dict[str, str] = {}
    for path, kind in found:
        first.setdefault(path, kind)
    return list(first.items())


def _unsecret_request_id(document: object, key_id: Callable[[], str | None], scanner: SecretScanner) -> str | None:
    """The request id of a document that may hold a credential: never one that looks like one."""
    request_id = document.get("request_id") if isinstance(document, dict) else None
    return (
        request_id
        if isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) and not scanner.kind(request_id)
        else key_id()
    )


def _request_id_of(document: object, key_id: Callable[[], str | None]) -> str | None:
    request_id = document.get("request_id") if isinstance(document, dict) else None
    return request_id if isinstance(request_id, str) and _REQUEST_ID.fullmatch(request_id) else key_id()


def _request_id_from_key(key: bytes | None, scanner: SecretScanner) -> str | None:
    try:
        text = (key or b"").decode()
    except UnicodeDecodeError:
        return None
    if not _REQUEST_ID.fullmatch(text):
        return None
    return None if scanner.kind(text) else text
