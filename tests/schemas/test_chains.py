"""A request's `after` and `start_from` (schemas/chains.py): what the request alone says is judged at decoding, each
refusal naming its field."""

from __future__ import annotations

import json

import pytest

from schemas import RequestBase, decode_request
from schemas.decode import Rejection
from tests.helpers import example_request


def decoded(method: str = "dpo", **fields: object) -> RequestBase | Rejection:
    return decode_request(json.dumps(example_request(method, "dpo-1", **fields)).encode())


def test_a_pipeline_step_names_what_it_waits_for_and_starts_from() -> None:
    request = decoded(after=["data-1", "sft-1"], start_from="sft-1")
    assert isinstance(request, RequestBase)
    assert (request.after, request.start_from) == (["data-1", "sft-1"], "sft-1")
    plain = decoded()
    assert isinstance(plain, RequestBase) and (plain.after, plain.start_from) == ([], None)


@pytest.mark.parametrize(
    ("fields", "path", "says"),
    [
        ({"after": ["dpo-1"]}, "after", "names the request itself"),
        ({"after": ["sft-1", "sft-1"]}, "after", "'sft-1' is named twice"),
        ({"after": [f"s{i}" for i in range(17)]}, "after", "at most 16"),
        ({"after": ["not an id"]}, "after.0", "pattern"),
        ({"after": ["sft-1"], "start_from": "sft-2"}, "start_from", "'sft-2' is not among after"),
        ({"start_from": "sft-1"}, "start_from", "is not among after"),
    ],
)
def test_a_chain_the_request_alone_makes_impossible_is_rejected_naming_the_field(
    fields: dict[str, object], path: str, says: str
) -> None:
    rejection = decoded(**fields)
    assert isinstance(rejection, Rejection) and rejection.reason == "invalid"
    [error] = rejection.errors
    assert error.path == path and says in error.message, error


def test_start_from_is_refused_for_a_method_that_does_not_load_it() -> None:
    rejection = decoded("kto", after=["sft-1"], start_from="sft-1")
    assert isinstance(rejection, Rejection)
    assert rejection.errors[0].path == "start_from" and "not for method kto" in rejection.errors[0].message


def test_a_start_is_not_trained_sharded() -> None:
    rejection = decoded(after=["sft-1"], start_from="sft-1", resources={"gpus": 2, "shard": "fsdp"})
    assert isinstance(rejection, Rejection)
    assert rejection.errors[0].path == "resources.shard" and "start_from sft-1" in rejection.errors[0].message
