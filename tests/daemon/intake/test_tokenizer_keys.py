"""Tokenizer settings are not credentials (issue 61): a request carrying `tool_call_token` or another of
transformers' special-token names, in metadata or inline rows, decodes with the daemon's
scanner (detect-secrets' keywords added); real credential keys there are still refused, naming the key and
never echoing the value. In process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from daemon.admission.secret_rules import SCANNER
from schemas import Rejection, RequestBase, decode_request
from tests.helpers import sft_request

VALUE = "hf_SECRETSECRETSECRET"
TOKENIZER_SETTINGS = {
    "tool_call_token": "<tool_call>",
    "bos_token": "<s>",
    "eos_token": "</s>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "sep_token": "<sep>",
    "cls_token": "<cls>",
    "mask_token": "<mask>",
    "image_token": "<image>",
    "boi_token": "<start_of_image>",
    "image_break_token": "[IMG_BREAK]",
}


def decoded(**overrides: Any) -> RequestBase | Rejection:
    return decode_request(
        json.dumps(sft_request("tokenizer-keys", **overrides)).encode(), b"tokenizer-keys", scanner=SCANNER
    )


def test_tokenizer_settings_in_metadata_and_inline_rows_are_taken() -> None:
    assert isinstance(decoded(metadata=TOKENIZER_SETTINGS), RequestBase)
    assert isinstance(
        decoded(dataset={"rows": [{"text": "a", **TOKENIZER_SETTINGS}, {"text": "b", **TOKENIZER_SETTINGS}]}),
        RequestBase,
    )


@pytest.mark.parametrize(
    "name", ["hf_token", "api_token", "access_token", "token", "image_api_token", "tool_auth_token"]
)
def test_credential_keys_beside_them_are_still_refused_naming_the_key(name: str) -> None:
    refused = decoded(metadata={**TOKENIZER_SETTINGS, name: VALUE})
    assert isinstance(refused, Rejection) and refused.reason == "secret_in_request"
    assert [error.path for error in refused.errors] == [f"metadata.{name}"] and VALUE not in repr(refused)
