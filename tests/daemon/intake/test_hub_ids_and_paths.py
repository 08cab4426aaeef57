"""Hub ids judged by huggingface_hub's own validator at intake, and local paths holding what no path
can (a NUL): each a `policy` rejection naming its field, never accepted to fail later nor an
`internal` rejection (issue 37)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from daemon.admission.judge import refusal as judged
from daemon.resources.slots import Slots
from daemon.settings import Settings
from schemas import Rejection, RequestBase, decode_request
from tests.helpers import sft_request

HUB_IDS = ["my-org/x.git", "my-org/a--b", "my-org/a..b", "my-org/x.", "my-org/x-", "my-org/" + "a" * 97]


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        allowed_local_model_roots=[tmp_path],
        allowed_local_dataset_roots=[tmp_path],
    )


def refusal(settings: Settings, **overrides: Any) -> Rejection | None:
    decoded = decode_request(json.dumps(sft_request("r1", **overrides)).encode())
    assert isinstance(decoded, RequestBase), decoded
    return judged(decoded, settings, Slots([], 1))


@pytest.mark.parametrize("repo_id", HUB_IDS)
def test_an_output_repo_the_hub_refuses_is_rejected_naming_it(settings: Settings, repo_id: str) -> None:
    rejection = refusal(settings, output={"repo_id": repo_id})
    assert rejection is not None and rejection.reason == "policy"
    assert [error.path for error in rejection.errors] == ["output.repo_id"]


@pytest.mark.parametrize("repo_id", HUB_IDS)
def test_model_and_dataset_ids_the_hub_refuses_are_rejected_naming_them(settings: Settings, repo_id: str) -> None:
    rejection = refusal(settings, model={"id": repo_id}, dataset={"id": repo_id})
    assert rejection is not None and {error.path for error in rejection.errors} == {"model.id", "dataset.id"}


def test_hub_ids_the_hub_takes_pass(settings: Settings) -> None:
    assert refusal(settings, output={"repo_id": "my-org/" + "a" * 96}) is None


@pytest.mark.parametrize(
    ("overrides", "path"),
    [
        ({"model": {"id": "/x\u0000"}}, "model.id"),
        ({"dataset": {"url": "/data/a\u0000.jsonl"}}, "dataset.url"),
        ({"dataset": {"files": {"train": "/data/a\u0000.jsonl"}}}, "dataset.files.train"),
    ],
)
def test_a_nul_in_a_local_path_is_rejected_naming_the_field(
    settings: Settings, overrides: dict[str, Any], path: str
) -> None:
    rejection = refusal(settings, **overrides)
    assert rejection is not None and rejection.reason == "policy", rejection
    assert [error.path for error in rejection.errors] == [path] and "NUL" in rejection.errors[0].message
