"""A revision a request reads at (the base's, a reference's or teacher's, a dataset's) is held to git's
ref rules at intake, naming the field: huggingface_hub has no check of its own, and names a file of
its cache after a revision it resolves (`refs/<revision>`), so "../x" never gets that far (issue 37)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas import Rejection, decode_request
from tests.helpers import example_request, sft_request

REFUSED = ["../../etc/passwd", "main/../x", "a b", "x\u0000", "-x", "v1.lock", "a//b", ".hidden", "x" * 256, ""]
TAKEN = ["main", "v1.0", "refs/pr/3", "refs/convert/parquet", "0123456789abcdef0123456789abcdef01234567", "feature/x-1"]


def _decoded(where: str, revision: str) -> Any:
    if where == "model.revision":
        request = sft_request("r", model={"id": "org/base", "revision": revision})
    elif where == "dataset.revision":
        request = sft_request("r", dataset={"id": "org/rows", "revision": revision})
    else:
        request = example_request("dpo", "r", ref_model={"id": "org/ref", "revision": revision})
    return decode_request(json.dumps(request).encode())


@pytest.mark.parametrize("where", ["model.revision", "dataset.revision", "ref_model.revision"])
@pytest.mark.parametrize("revision", REFUSED)
def test_a_revision_git_would_refuse_is_rejected_naming_its_field(where: str, revision: str) -> None:
    decoded = _decoded(where, revision)
    assert isinstance(decoded, Rejection) and [error.path for error in decoded.errors] == [where], decoded
    assert "revision" in decoded.errors[0].message


@pytest.mark.parametrize("where", ["model.revision", "dataset.revision", "ref_model.revision"])
@pytest.mark.parametrize("revision", TAKEN)
def test_branches_tags_shas_and_hub_refs_are_taken(where: str, revision: str) -> None:
    decoded = _decoded(where, revision)
    assert not isinstance(decoded, Rejection), decoded
