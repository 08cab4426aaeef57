"""The key-name rule of the secret scan (issue 42): a value under a key whose name says it holds a
credential is refused naming the key, whatever the value's shape; names that only contain a
keyword (`tokenizer_name`, `max_tokens`) are not. In process, with the built-in keywords (a
producer's view); tests/daemon/test_hostile_intake.py checks the daemon's, detect-secrets' added."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.intake import bad_message
from schemas import Rejection, decode_request
from schemas.secret_keys import words
from schemas.secrets import BUILTIN
from tests.helpers import sft_request

VALUE = "hf_SECRETSECRETSECRET"  # the value: short, low in entropy, no issuer's shape
TOKEN = "hf_" + "Qx7" * 12  # a Hub token's shape

CREDENTIAL_NAMES = [
    "HF_TOKEN", "hf_token", "hfToken", "HFToken", "hf-token", "hf.token", "Hf Token", "hftoken", "token", "TOKEN",
    "access_token", "accessToken", "x-auth-token", "HUGGING_FACE_HUB_TOKEN", "github_token",
    "db-password", "DB_PASSWORD", "dbPassword", "password", "Password", "passwd", "user_password_2",
    "x-api-key", "X-API-KEY", "api_key", "apiKey", "APIKey", "apikey", "API-KEY", "openai_api_key",
    "secret", "SECRET", "client_secret", "clientSecret", "aws_secret_access_key", "webhook-secret",
    "Authorization", "authorization", "auth", "Auth", "x-auth", "basic_auth", "oauth", "proxyAuthorization",
    "credentials", "credential", "gcp_credentials", "passphrase", "ssh_passphrase", "bearer", "session_cookie",
    "private_key", "privateKey", "secret_pad_token",
]
HARMLESS_NAMES = [
    "tokenizer_name", "max_tokens", "num_tokens", "tokenizer", "Tokenizer", "tokenizerName", "TOKENIZER_NAME",
    "max_new_tokens", "tokens_per_s", "token_type_ids", "token_count", "add_special_tokens",
    "pad_token", "eos_token", "bos_token", "stop_token", "stop_token_id", "pad_token_id", "image_token",
    "author", "authors", "authored_by", "keyword", "key", "monkey", "primary_key_column", "pass_threshold",
    "team", "owner", "run_name", "notes",
]


@pytest.mark.parametrize("name", CREDENTIAL_NAMES)
def test_a_credential_name_is_named_so_in_any_spelling(name: str) -> None:
    assert BUILTIN.keys.names_credential(name), (name, words(name))


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_a_name_that_only_contains_a_keyword_is_harmless(name: str) -> None:
    assert not BUILTIN.keys.names_credential(name), (name, words(name))


def test_a_name_is_split_into_lowercase_words() -> None:
    assert [words(name) for name in ("hfToken", "HF-TOKEN", "hf.token", "__hf__token__", "xApiKey", "HFToken")] == [
        "hf_token", "hf_token", "hf_token", "hf_token", "x_api_key", "hftoken"]


def rejection(**overrides: Any) -> Rejection:
    decoded = decode_request(json.dumps(sft_request("keys", **overrides)).encode())
    assert isinstance(decoded, Rejection), decoded
    return decoded


@pytest.mark.parametrize("name", ["hf_token", "HF_TOKEN", "hfToken", "db-password", "x-api-key", "Authorization"])
def test_a_metadata_value_under_a_credential_name_is_refused_naming_the_key(name: str) -> None:
    refused = rejection(metadata={"team": "tests", name: VALUE})
    assert refused.reason == "secret_in_request"
    assert [error.path for error in refused.errors] == [f"metadata.{name}"]
    assert VALUE not in repr(refused)


def test_free_form_mappings_beyond_metadata_are_judged_too() -> None:
    refused = rejection(
        training={"max_steps": 4, "lr_scheduler_kwargs": {"api_key": VALUE, "auth": {"user": "u", "pass": VALUE}}},
        dataset={"rows": [{"text": "t"}, {"text": "t", "password": VALUE}]},
    )
    assert refused.reason == "secret_in_request"
    assert [error.path for error in refused.errors] == [
        "dataset.rows.1.password", "training.lr_scheduler_kwargs.api_key", "training.lr_scheduler_kwargs.auth"]
    assert VALUE not in repr(refused)


def test_a_value_of_a_known_shape_is_named_once_by_its_shape() -> None:
    refused = rejection(metadata={"hf_token": TOKEN})
    assert [(error.path, error.message.split(";")[0]) for error in refused.errors] == [
        ("metadata.hf_token", "looks like a Hugging Face token (hf_...)")]


def test_a_path_never_repeats_a_key_that_is_itself_a_credential() -> None:
    refused = rejection(training={"max_steps": 4, "lr_scheduler_kwargs": {TOKEN: {"password": VALUE}}})
    assert {error.path for error in refused.errors} == {"training.lr_scheduler_kwargs.<key>", "training.lr_scheduler_kwargs.<key>.password"}
    assert TOKEN not in repr(refused) and VALUE not in repr(refused)


def test_an_escaped_name_is_judged_as_it_decodes() -> None:
    raw = json.dumps(sft_request("escaped", metadata={"hf_token": VALUE})).replace("hf_token", "hf_\\u0074oken").encode()
    refused = decode_request(raw)
    assert isinstance(refused, Rejection) and [error.path for error in refused.errors] == ["metadata.hf_token"]


def test_a_credential_name_without_a_value_and_harmless_names_are_accepted() -> None:
    request = sft_request("harmless", metadata={"tokenizer_name": "tiny/qwen2-chat", "max_tokens": "64", "password": ""},
                          training={"max_steps": 4, "lr_scheduler_kwargs": {"use_auth": True, "token": None}})
    decoded = decode_request(json.dumps(request).encode())
    assert not isinstance(decoded, Rejection), decoded
    assert decoded.metadata["tokenizer_name"] == "tiny/qwen2-chat"


def test_the_walk_runs_only_when_a_key_is_a_credential_name() -> None:
    # The cost: the keys holding a keyword's letters are read from the raw bytes and judged there;
    # intake's bad-message mix, values that mention tokens and harmless names never start the walk.
    assert not any(BUILTIN.keys.may_hold(bad_message(index)) for index in range(4))
    rows = [{"text": f"a row about tokens and passwords {index}"} for index in range(100)]
    assert not BUILTIN.keys.may_hold(json.dumps(sft_request("rows", dataset={"rows": rows})).encode())
    assert not BUILTIN.keys.may_hold(json.dumps({"metadata": {"tokenizer_name": "x", "max_tokens": "64", "note": "token"}}).encode())
    assert BUILTIN.keys.may_hold(json.dumps({"metadata": {"note": "x", "HF_TOKEN": "x"}}).encode())
    assert BUILTIN.keys.may_hold(json.dumps({"metadata": {"HF_TOKEN" : "x"}}, indent=2).encode())  # whitespace before ':'
    assert BUILTIN.keys.may_hold(b'{"metadata": {"hf_\\u0074oken": "x"}}')  # an escape is always walked
