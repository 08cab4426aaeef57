"""A request's `resources.gpu_kind` (one kind or a list) and `resources.min_gpu_memory_gib`: decoded, and each bad
value refused naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import Rejection, RequestBase, decode_request
from tests.schemas.test_decode import valid


def decoded(resources: dict[str, Any]) -> RequestBase | Rejection:
    return decode_request(json.dumps({**valid(), "resources": resources}).encode())


def test_a_kind_a_list_of_kinds_or_a_minimum_memory_is_taken() -> None:
    one = decoded({"gpu_kind": "h100-80gb"})
    several = decoded({"gpu_kind": ["h100-80gb", "a100-80gb"], "min_gpu_memory_gib": 80})
    neither = decoded({})
    assert isinstance(one, RequestBase) and one.resources.gpu_kinds == ("h100-80gb",)
    assert isinstance(several, RequestBase) and several.resources.gpu_kinds == ("h100-80gb", "a100-80gb")
    assert several.resources.min_gpu_memory_gib == 80
    assert isinstance(neither, RequestBase) and neither.resources.gpu_kinds is None
    assert neither.resources.min_gpu_memory_gib is None


@pytest.mark.parametrize(
    ("resources", "path", "says"),
    [
        ({"gpu_kind": "H100 80GB"}, "resources.gpu_kind", "'H100 80GB' is not a GPU kind's name"),
        ({"gpu_kind": ["h100-80gb", "x" * 40]}, "resources.gpu_kind", "is not a GPU kind's name"),
        ({"gpu_kind": []}, "resources.gpu_kind", "a list of 1 to 16 kinds, got 0"),
        ({"gpu_kind": [f"k{i}" for i in range(17)]}, "resources.gpu_kind", "a list of 1 to 16 kinds, got 17"),
        ({"min_gpu_memory_gib": 0}, "resources.min_gpu_memory_gib", "greater than 0"),
        ({"min_gpu_memory_gib": 5000}, "resources.min_gpu_memory_gib", "less than or equal to 4096"),
    ],
)
def test_a_bad_kind_or_memory_is_refused_naming_its_field(resources: dict[str, Any], path: str, says: str) -> None:
    rejection = decoded(resources)
    assert isinstance(rejection, Rejection) and rejection.reason == "invalid"
    assert [error.path for error in rejection.errors] == [path]
    assert says in rejection.errors[0].message
