"""The dataset sources a request may name, and the two intake refusals that protect the host: a
Hub id's data_files never point off the repo, and no credential-looking value gets in."""

import json
from typing import Any

import pytest

from schemas import Rejection, RequestBase, decode_request
from tests.helpers import sft_request

HF_TOKEN = "hf_" + "Ab3" * 12  # the shape of a real token, not one
AWS_KEY = "AKIA" + "Z7Q2" * 4


def decode(request: dict[str, Any]) -> RequestBase | Rejection:
    return decode_request(json.dumps(request).encode(), request["request_id"].encode())


def errors(outcome: RequestBase | Rejection) -> dict[str, str]:
    assert isinstance(outcome, Rejection), outcome
    return {error.path: error.message for error in outcome.errors}


@pytest.mark.parametrize(
    "value, kind",
    [
        (HF_TOKEN, "Hugging Face token"),
        (AWS_KEY, "AWS access key"),
        ("ASIA" + "B" * 16, "AWS access key"),
        ("-----BEGIN RSA PRIVATE KEY-----\nMIIE...", "private key"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.abcdef", "bearer token"),
        ("s3://AKIDEXAMPLE:wJalrXUtnFEMI@bucket/x", "password"),
    ],
)
def test_a_credential_in_metadata_is_refused_without_echoing_it(value: str, kind: str) -> None:
    outcome = decode(sft_request("secret-1", metadata={"note": f"see {value}"}))
    assert isinstance(outcome, Rejection) and outcome.reason == "secret_in_request" and outcome.request_id == "secret-1"
    found = errors(outcome)
    assert list(found) == ["metadata.note"] and kind in found["metadata.note"]
    assert value not in repr(outcome) and value[:12] not in repr(outcome)


def test_a_credential_anywhere_is_found_and_a_secret_looking_id_is_not_repeated() -> None:
    request = sft_request(HF_TOKEN, dataset={"rows": [{"text": "fine"}, {"text": f"token {AWS_KEY}"}]})
    outcome = decode(request)
    assert isinstance(outcome, Rejection) and outcome.reason == "secret_in_request"
    assert set(errors(outcome)) == {
        "request_id",
        "output.repo_id",
        "dataset.rows.1.text",
    }  # sft_request names the repo after the id
    assert outcome.request_id is None and HF_TOKEN not in repr(outcome)
    secret_key = decode(sft_request("secret-2", metadata={HF_TOKEN: "x"}))
    assert list(errors(secret_key)) == ["metadata.<key>"] and HF_TOKEN not in repr(secret_key)


def test_ordinary_text_about_tokens_is_not_a_secret() -> None:
    assert isinstance(
        decode(sft_request("plain-1", metadata={"note": "hf_transfer speeds up tokens; bearer of news"})), RequestBase
    )


@pytest.mark.parametrize(
    "data_files",
    ["/etc/passwd", "file:///etc/passwd", "s3://bucket/x.json", "../other/x.json", {"train": ["ok.json", "/abs.json"]}],
)
def test_data_files_under_a_hub_id_stay_inside_the_repo(data_files: Any) -> None:
    found = errors(decode(sft_request("files-1", dataset={"id": "org/ds", "data_files": data_files})))
    assert "paths inside its repo" in found["dataset.data_files"]
    assert isinstance(
        decode(sft_request("files-2", dataset={"id": "org/ds", "data_files": {"train": "data/*.jsonl"}})), RequestBase
    )


def test_single_name_hub_ids_and_every_source_shape_decode() -> None:
    for dataset in [
        {"id": "imdb"},
        {"url": "s3://ml-data/curated/chat/*.parquet"},
        {"url": "/data/chat/", "format": "jsonl"},
        {"files": {"train": ["gs://b/train-*.parquet"], "test": "az://c/test.parquet"}, "eval_split": "test"},
        {"id": "org/ds", "eval": {"url": "/data/eval.jsonl"}},
        {
            "mixture": [
                {"id": "org/ds", "proportion": 3},
                {"url": "s3://b/x.parquet", "proportion": 1, "columns": {"t": "text"}},
            ]
        },
    ]:
        assert isinstance(decode(sft_request("shape-1", dataset=dataset)), RequestBase), dataset


def test_malformed_sources_name_their_field() -> None:
    assert "exactly one" in errors(decode(sft_request("bad-1", dataset={"id": "org/ds", "url": "/data/x"})))["dataset"]
    assert "'..'" in errors(decode(sft_request("bad-2", dataset={"url": "/data/../etc/x.json"})))["dataset.url"]
    assert "url" in next(iter(errors(decode(sft_request("bad-3", dataset={"url": "http://example.com/x.json"})))))
    assert "dataset.revision" in errors(
        decode(sft_request("bad-4", dataset={"url": "/data/x.json", "revision": "main"}))
    )
    assert "dataset.files.train.1" in errors(
        decode(sft_request("bad-5", dataset={"files": {"train": ["/d/a.json", "/d/../b.json"]}}))
    )


def test_streaming_needs_max_steps() -> None:
    training = {"learning_rate": 1e-3}
    found = errors(
        decode(sft_request("stream-1", dataset={"url": "s3://b/x.parquet", "streaming": True}, training=training))
    )
    assert "max_steps" in found["training.max_steps"]
    assert isinstance(
        decode(sft_request("stream-2", dataset={"url": "s3://b/x.parquet", "streaming": True})), RequestBase
    )
