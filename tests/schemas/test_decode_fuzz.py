"""Thousands of malformed messages: the decoder never raises, and each one it refuses comes with a
reason and at least one error that names what was wrong."""

from typing import get_args

from schemas import Rejection, RequestBase, decode_request
from schemas.common import RejectReason
from tests.fuzz import malformed_messages


def test_every_malformed_message_is_rejected_with_a_reason() -> None:
    reasons = set(get_args(RejectReason))
    refused, accepted, seen_reasons = 0, 0, set()
    for raw in malformed_messages(5000, seed=20261130):
        outcome = decode_request(raw, b"fuzz-key")
        if isinstance(outcome, RequestBase):
            accepted += 1  # a mutation that left the request valid, e.g. an optional field removed
            continue
        assert isinstance(outcome, Rejection)
        assert outcome.reason in reasons and outcome.errors, (raw[:200], outcome)
        assert all(error.message for error in outcome.errors)
        refused += 1
        seen_reasons.add(outcome.reason)
    assert refused > 4000
    assert seen_reasons >= {"not_json", "not_an_object", "unknown_method", "invalid"}
