"""Strict JSON and strict types (issue 37): a key given twice in one object is a rejection naming
it (the last copy would win silently, out of the secret scan's sight), and nothing in a request is
coerced: a string is not a number, a number is not a boolean, an integer is never spelled as text."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import Rejection, RequestBase, decode_request
from tests.helpers import sft_request

TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"


def rejected(raw: bytes) -> Rejection:
    decoded = decode_request(raw)
    assert isinstance(decoded, Rejection), decoded
    return decoded


def test_a_key_given_twice_is_rejected_naming_it_without_its_value() -> None:
    raw = json.dumps(sft_request("dup")).encode()
    raw = raw[:-1] + f', "metadata": {{"note": "{TOKEN}"}}, "metadata": {{}}}}'.encode()
    rejection = rejected(raw)
    assert rejection.reason == "invalid" and [error.path for error in rejection.errors] == ["metadata"]
    assert rejection.request_id == "dup" and TOKEN not in repr(rejection)


def test_a_nested_key_given_twice_is_named_by_its_path() -> None:
    raw = (
        json.dumps(sft_request("dup"))
        .encode()
        .replace(b'"output": {', b'"output": {"private": true, "private": false, ', 1)
    )
    assert [error.path for error in rejected(raw).errors] == ["output.private"]


def test_every_repeated_key_is_named_not_only_the_first() -> None:
    # The decoder stops at the first repeat; the message is then read again to name them all.
    raw = json.dumps(sft_request("dup")).encode()
    raw = raw.replace(b'"output": {', b'"output": {"private": true, "private": false, ', 1)
    raw = raw.replace(b'"peft": {', b'"peft": {"r": 8, "r": 4, ', 1)
    assert sorted(error.path for error in rejected(raw).errors) == ["output.private", "peft.r"]


def test_a_repeat_before_a_syntax_error_is_still_not_json() -> None:
    raw = b'{"request_id": "dup", "method": "sft", "method": "dpo", "model": '
    rejection = rejected(raw)
    assert rejection.reason == "not_json" and "Expecting value" in rejection.errors[0].message


def test_a_byte_order_mark_is_not_json_as_json_loads_says() -> None:
    rejection = rejected("\ufeff".encode() + json.dumps(sft_request("bom")).encode())
    assert rejection.reason == "not_json" and "BOM" in rejection.errors[0].message


def test_the_same_key_in_two_objects_is_not_a_repeat() -> None:
    assert isinstance(decode_request(json.dumps(sft_request("ok", metadata={"id": "a"})).encode()), RequestBase)


@pytest.mark.parametrize(
    ("block", "field", "value"),
    [
        ("training", "per_device_train_batch_size", "8"),
        ("training", "per_device_train_batch_size", True),
        ("training", "per_device_train_batch_size", 8.0),
        ("training", "max_steps", "9" * 4300),
        ("training", "learning_rate", "1e-4"),
        ("training", "learning_rate", True),
        ("output", "private", "no"),
        ("output", "private", 0),
        ("peft", "r", "8"),
    ],
)
def test_nothing_is_coerced(block: str, field: str, value: Any) -> None:
    document = sft_request("strict")
    document.setdefault(block, {})[field] = value
    rejection = rejected(json.dumps(document).encode())
    assert [error.path for error in rejection.errors] == [f"{block}.{field}"], rejection.errors


def test_the_same_values_spelled_as_json_types_are_accepted() -> None:
    document = sft_request("typed")
    document["training"] = {**document.get("training", {}), "per_device_train_batch_size": 8, "learning_rate": 1}
    document["output"] = {**document["output"], "private": False}
    assert isinstance(decode_request(json.dumps(document).encode()), RequestBase)
