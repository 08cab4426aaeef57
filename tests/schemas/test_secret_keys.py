"""The key-name rule of the secret scan (issue 42): a value under a key whose name says it holds a
credential is refused naming the key, whatever the value's shape; names that only contain a
keyword (`tokenizer_name`, `max_tokens`) are not. In process, with the built-in keywords (a
producer's view); tests/daemon/intake/test_hostile_intake.py checks the daemon's, detect-secrets' added."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.intake import bad_message
from schemas import Rejection, decode_request
from schemas.secret_keys import words
from schemas.secrets import BUILTIN
from tests.helpers import sft_request

VALUE = "hf_SECRETSECRETSECRET"  # the value: short, low in entropy, no issuer's shape
TOKEN = "hf_" + "Qx7" * 12  # a Hub token's shape

CREDENTIAL_NAMES = [
    "HF_TOKEN",
    "hf_token",
    "hfToken",
    "HFToken",
    "hf-token",
    "hf.token",
    "Hf Token",
    "hftoken",
    "token",
    "TOKEN",
    "access_token",
    "accessToken",
    "x-auth-token",
    "HUGGING_FACE_HUB_TOKEN",
    "github_token",
    "db-password",
    "DB_PASSWORD",
    "dbPassword",
    "password",
    "Password",
    "passwd",
    "user_password_2",
    "x-api-key",
    "X-API-KEY",
    "api_key",
    "apiKey",
    "APIKey",
    "apikey",
    "API-KEY",
    "openai_api_key",
    "secret",
    "SECRET",
    "client_secret",
    "clientSecret",
    "aws_secret_access_key",
    "webhook-secret",
    "Authorization",
    "authorization",
    "auth",
    "Auth",
    "x-auth",
    "basic_auth",
    "oauth",
    "proxyAuthorization",
    "credentials",
    "credential",
    "gcp_credentials",
    "passphrase",
    "ssh_passphrase",
    "bearer",
    "session_cookie",
    "private_key",
    "privateKey",
    "secret_pad_token",
    # Issue 46: more credential words, whole where glued they end other words.
    "session",
    "user_session",
    "access_key",
    "accessKey",
    "aws_access_key_id",
    "jwt",
    "user_jwt",
    "dsn",
    "sentry_dsn",
    "connection_string",
    "connectionString",
    "AZURE_STORAGE_CONNECTION_STRING",
    "pass",
    "db_pass",
    "user-pass",
    "bot_token",
]
# Issue 46: lookalikes spelling a credential name, by their Unicode skeleton.
LOOKALIKE_NAMES = [
    "\uff50\uff41\uff53\uff53\uff57\uff4f\uff52\uff44",  # fullwidth ｐａｓｓｗｏｒｄ
    "p\u0430ssword",  # Cyrillic а
    "to\u200bken",  # a zero-width space
    "HF_\u200dTOKEN\ufeff",  # a zero-width joiner, a byte-order mark
    "\uff28\uff26\uff3f\uff34\uff2f\uff2b\uff25\uff2e",  # fullwidth ＨＦ＿ＴＯＫＥＮ
    "\u0455ecret",  # Cyrillic ѕ
    "\u03c1assword",  # Greek ρ
    "AUTH\u039fR\u0399ZATI\u039fN",  # Greek capital Ο and Ι
    "hf\u0422oken",  # Cyrillic capital Т
    "\U0001d429\U0001d41a\U0001d42c\U0001d42c",  # mathematical bold 𝐩𝐚𝐬𝐬
    "api\u2010key",  # a Unicode hyphen
]
HARMLESS_NAMES = [
    "tokenizer_name",
    "max_tokens",
    "num_tokens",
    "tokenizer",
    "Tokenizer",
    "tokenizerName",
    "TOKENIZER_NAME",
    "max_new_tokens",
    "tokens_per_s",
    "token_type_ids",
    "token_count",
    "add_special_tokens",
    "pad_token",
    "eos_token",
    "bos_token",
    "stop_token",
    "stop_token_id",
    "pad_token_id",
    "image_token",
    "author",
    "authors",
    "authored_by",
    "keyword",
    "key",
    "monkey",
    "primary_key_column",
    "pass_threshold",
    "team",
    "owner",
    "run_name",
    "notes",
    # Issue 46: a tokenizer's tokens, by the word before `token`; words that only end in a credential word.
    "eot_token",
    "boi_token",
    "eom_token",
    "fim_prefix_token",
    "fim_suffix_token",
    "assistant_token",
    "chat_template_token",
    "max_token",
    "sot_token",
    "eoi_token",
    "start_of_turn_token",
    "bypass",
    "compass",
    "obsession",
    "session_count",
    "passage",
    "jwt_algorithm",
    "tokenizer_n\u0430me",
    "\uff54\uff4f\uff4b\uff45\uff4e\uff49\uff5a\uff45\uff52",
]


@pytest.mark.parametrize("name", CREDENTIAL_NAMES)
def test_a_credential_name_is_named_so_in_any_spelling(name: str) -> None:
    assert BUILTIN.keys.names_credential(name), (name, words(name))


@pytest.mark.parametrize("name", LOOKALIKE_NAMES)
def test_a_credential_name_in_lookalikes_is_judged_by_its_skeleton(name: str) -> None:
    assert BUILTIN.keys.names_credential(name), (name, words(name))
    assert BUILTIN.keys.may_hold(
        json.dumps({"metadata": {name: "x"}}, ensure_ascii=False).encode()
    )  # raw UTF-8, no escape


def test_a_skeleton_keeps_what_unicode_does_not_call_confusable() -> None:
    # Cyrillic lowercase т is confused with small capital ᴛ, not t (UTS #39); Cyrillic Н with H.
    assert [words(name) for name in ("p\u0430ss\u200bword", "\u0422\u041e\u041a\u0415\u041d", "contrase\u00f1a")] == [
        "password",
        "tokeh",
        "contrase\u00f1a",
    ]


@given(st.sampled_from(["password", "hf_token", "api_key", "secret", "connection_string", "db_pass"]), st.data())
def test_any_spelling_in_lookalikes_of_a_credential_name_is_one(name: str, data: st.DataObject) -> None:
    # Each letter as it is, fullwidth, or a lookalike of another script, with zero-width characters
    # between letters: the name's skeleton is the same, and so is the verdict.
    lookalikes = {
        "a": "\u0430\u0251",
        "e": "\u0435",
        "o": "\u043e\u03bf",
        "p": "\u0440\u03c1",
        "s": "\u0455",
        "c": "\u0441",
        "i": "\u0456\u03b9",
        "k": "\u212a",
        "y": "\u0443",
        "x": "\u0445",
    }
    spelled = ""
    for char in name:
        choices = [char, chr(ord(char) + 0xFEE0) if char.isalpha() else "\uff3f", *lookalikes.get(char, "")]
        spelled += data.draw(st.sampled_from(choices)) + data.draw(
            st.sampled_from(["", "", "\u200b", "\u200c", "\u2060"])
        )
    assert words(spelled) == name, (spelled, words(spelled))
    assert BUILTIN.keys.names_credential(spelled), spelled


@pytest.mark.parametrize("name", HARMLESS_NAMES)
def test_a_name_that_only_contains_a_keyword_is_harmless(name: str) -> None:
    assert not BUILTIN.keys.names_credential(name), (name, words(name))


def test_a_lookalike_key_is_refused_naming_the_key_as_written() -> None:
    name = "p\u0430ssword"
    raw = json.dumps(sft_request("lookalike", metadata={"team": "t", name: VALUE}), ensure_ascii=False).encode()
    refused = decode_request(raw)
    assert isinstance(refused, Rejection) and refused.reason == "secret_in_request"
    assert [error.path for error in refused.errors] == [f"metadata.{name}"] and VALUE not in repr(refused)


def test_a_name_is_split_into_lowercase_words() -> None:
    assert [words(name) for name in ("hfToken", "HF-TOKEN", "hf.token", "__hf__token__", "xApiKey", "HFToken")] == [
        "hf_token",
        "hf_token",
        "hf_token",
        "hf_token",
        "x_api_key",
        "hftoken",
    ]


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
        "dataset.rows.1.password",
        "training.lr_scheduler_kwargs.api_key",
        "training.lr_scheduler_kwargs.auth",
    ]
    assert VALUE not in repr(refused)


def test_a_value_of_a_known_shape_is_named_once_by_its_shape() -> None:
    refused = rejection(metadata={"hf_token": TOKEN})
    assert [(error.path, error.message.split(";")[0]) for error in refused.errors] == [
        ("metadata.hf_token", "looks like a Hugging Face token (hf_...)")
    ]


def test_a_path_never_repeats_a_key_that_is_itself_a_credential() -> None:
    refused = rejection(training={"max_steps": 4, "lr_scheduler_kwargs": {TOKEN: {"password": VALUE}}})
    assert {error.path for error in refused.errors} == {
        "training.lr_scheduler_kwargs.<key>",
        "training.lr_scheduler_kwargs.<key>.password",
    }
    assert TOKEN not in repr(refused) and VALUE not in repr(refused)


def test_an_escaped_name_is_judged_as_it_decodes() -> None:
    raw = (
        json.dumps(sft_request("escaped", metadata={"hf_token": VALUE})).replace("hf_token", "hf_\\u0074oken").encode()
    )
    refused = decode_request(raw)
    assert isinstance(refused, Rejection) and [error.path for error in refused.errors] == ["metadata.hf_token"]


def test_a_credential_name_without_a_value_and_harmless_names_are_accepted() -> None:
    request = sft_request(
        "harmless",
        metadata={"tokenizer_name": "tiny/qwen2-chat", "max_tokens": "64", "password": ""},
        training={"max_steps": 4, "lr_scheduler_kwargs": {"use_auth": True, "token": None}},
    )
    decoded = decode_request(json.dumps(request).encode())
    assert not isinstance(decoded, Rejection), decoded
    assert decoded.metadata["tokenizer_name"] == "tiny/qwen2-chat"


def test_the_walk_runs_only_when_a_key_is_a_credential_name() -> None:
    # The cost: the keys holding a keyword's letters are read from the raw bytes and judged there;
    # intake's bad-message mix, values that mention tokens and harmless names never start the walk.
    assert not any(BUILTIN.keys.may_hold(bad_message(index)) for index in range(4))
    rows = [{"text": f"a row about tokens and passwords {index}"} for index in range(100)]
    assert not BUILTIN.keys.may_hold(json.dumps(sft_request("rows", dataset={"rows": rows})).encode())
    assert not BUILTIN.keys.may_hold(
        json.dumps({"metadata": {"tokenizer_name": "x", "max_tokens": "64", "note": "token"}}).encode()
    )
    assert BUILTIN.keys.may_hold(json.dumps({"metadata": {"note": "x", "HF_TOKEN": "x"}}).encode())
    assert BUILTIN.keys.may_hold(
        json.dumps({"metadata": {"HF_TOKEN": "x"}}, indent=2).encode()
    )  # whitespace before ':'
    assert BUILTIN.keys.may_hold(b'{"metadata": {"hf_\\u0074oken": "x"}}')  # an escape is always walked


def test_a_capital_only_nfkc_makes_ascii_begins_no_word() -> None:
    # Hypothesis found it: the Kelvin sign (U+212A) in `hf_to\u212aen` is `K` after NFKC; read as a camel-case
    # capital it cut `token` in two and the credential passed.
    assert words("hf_to\u212aen") == "hf_token"
    assert BUILTIN.keys.names_credential("hf_to\u212aen")
    assert words("hfToken") == "hf_token"  # an ASCII capital still begins a word


# Issue 61: transformers' tokenizers' and processors' token names, a part of a text earlier in the name than the
# word before `token`; and credentials that begin like one, the word before `token` saying whose credential it is.
TOKENIZER_NAMES = [
    "tool_call_token",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
    "sep_token",
    "cls_token",
    "mask_token",
    "image_token",
    "boi_token",
    "eoi_token",
    "video_token",
    "audio_token",
    "image_break_token",
    "img_line_break_token",
    "image_placeholder_token",
    "image_newline_token",
    "audio_delay_token",
    "audio_ms_per_token",
    "tile_global_token",
    "end_of_img_token",
    "word_delimiter_token",
    "phone_delimiter_token",
    "end_of_utterance_token",
    "blank_token",
    "fill_token",
    "vision_start_token",
    "toolCallToken",
    "TOOL_CALL_TOKEN",
]
STILL_CREDENTIALS = [
    "token",
    "hf_token",
    "api_token",
    "access_token",
    "auth_token",
    "refresh_token",
    "id_token",
    "image_api_token",
    "tool_auth_token",
    "vision_hf_token",
    "audio_access_token",
    "image_secret_token",
    "tool_calltoken",
    "image_hftoken",
    "tool_call_password",
    "chat_github_token",
]


@pytest.mark.parametrize("name", TOKENIZER_NAMES)
def test_a_tokenizers_token_names_are_not_credentials(name: str) -> None:
    assert not BUILTIN.keys.names_credential(name), (name, words(name))


@pytest.mark.parametrize("name", STILL_CREDENTIALS)
def test_a_credential_that_begins_like_a_tokenizers_token_is_still_one(name: str) -> None:
    assert BUILTIN.keys.names_credential(name), (name, words(name))
