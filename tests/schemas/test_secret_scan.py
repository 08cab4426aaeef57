"""The secret scan's automata (schemas/secrets.py): rules that start with a literal share one, each
rule that starts by counting a class runs apart (together they multiplied their states: 1.4 s a MiB of
random letters, measured by `benchmarks.record_intake`), and a document's strings are searched as one
text. Whatever the grouping and the joining, the verdicts are those of every rule run on each string
alone: the leftmost match, at one place the rule named first."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.admission.secret_rules import SCANNER
from schemas.json_text import SUSPECT_LEAF
from schemas.regex import compile_pattern
from schemas.secret_patterns import shares_automaton
from schemas.secrets import BUILTIN, SecretScanner

RULES = SCANNER.rules


def test_rules_that_start_with_a_literal_share_an_automaton_and_class_counting_ones_run_apart() -> None:
    assert shares_automaton(r"hf_[A-Za-z0-9]{30,64}") and shares_automaton(r"(?i:AccountKey=)[A-Za-z0-9+/]{20,}")
    assert shares_automaton(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b") and shares_automaton(
        r"-----BEGIN [A-Z0-9 ]{0,32}PRIVATE KEY-----"
    )
    assert not shares_automaton(r"[0-9a-z]{32}-us[0-9]{1,2}") and not shares_automaton(r"[MNO][a-zA-Z\d_-]{23,25}\.")
    assert not shares_automaton(r"(?i:\b[a-z][a-z0-9+.-]{0,31}://[^/\s:@]{1,256}:[^/\s@]{1,256}@)")
    assert not shares_automaton(r"\d{8,10}:[0-9A-Za-z_-]{35}") and not shares_automaton(
        r"(?:r|s)k_live_[0-9a-zA-Z]{24}"
    )
    shared = [name for name, (_, pattern) in RULES.items() if shares_automaton(pattern)]
    assert "hf" in shared and "ds_DiscordBotTokenDetector_0" not in shared and "url" not in shared
    assert len(SCANNER._automata) == 1 + len(RULES) - len(shared)


def reference(scanner: SecretScanner, document: Any, path: str = "") -> list[tuple[str, str]]:
    """`find` as it was: every rule at once, on one string at a time (leftmost-first), on the engine
    the scanner runs (schemas/regex.py): RE2's `\b` is ASCII's, Python re's Unicode's, so a reference
    on re would differ from the scan for a reason that is not the grouping or the joining
    ('éAKIA...' is an AWS key id to RE2 and not to re)."""
    combined = compile_pattern("|".join(f"(?P<{name}>{pattern})" for name, (_, pattern) in scanner.rules.items()))

    def kind(value: str) -> str | None:
        found = combined.search(value)
        if found is not None and found.lastgroup:
            return scanner.rules[found.lastgroup][0]
        return scanner.kinds([value]).get(0) if re.fullmatch(r"[A-Za-z0-9+/_]{32,512}={0,2}", value) else None

    def walk(node: Any, at: str) -> list[tuple[str, str]]:
        if isinstance(node, str):
            return [(at, k)] if (k := kind(node)) else []
        if isinstance(node, dict):
            out: list[tuple[str, str]] = []
            for key, value in node.items():
                if (k := kind(str(key))) is not None:
                    out.append((f"{at}.<key>" if at else "<key>", k))
                    continue
                out += walk(value, f"{at}.{key}" if at else str(key))
            return out
        if isinstance(node, list):
            return [
                item for index, value in enumerate(node) for item in walk(value, f"{at}.{index}" if at else str(index))
            ]
        return []

    return walk(document, path)


# Pieces of credentials and of what sits around them, so that matches start, end and straddle strings.
PIECES = [
    "hf_",
    "a" * 34,
    "Bearer",
    " ",
    "\n",
    "abcdefghijklmnopqrstuv",
    "AKIA",
    "ABCDEFGHIJKLMNOP",
    "M",
    "x" * 24,
    ".",
    "abcdef",
    "y" * 27,
    "https://",
    "user",
    ":",
    "pw@",
    "?token=",
    "12345678",
    "AC",
    "b" * 32,
    "-us1",
    "eyJ",
    "sk-ant-",
    "aGZfYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=",
    '"',
    "é",
]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=6).map("".join)
DOCUMENTS = st.recursive(
    TEXTS | st.integers(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXTS, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(DOCUMENTS)
def test_the_scan_names_what_each_string_alone_would(document: Any) -> None:
    for scanner in (SCANNER, BUILTIN):
        assert scanner.find(document) == reference(scanner, document)


def test_a_match_across_two_strings_is_none_and_the_strings_are_still_searched() -> None:
    # "Bearer" ends one string and a token starts the next: joined by a newline they would match the
    # bearer rule (it takes whitespace); each alone does not, and the second is still an hf token.
    document = {"a": ["say Bearer", "abcdefghijklmnopqrstuvwxyz", "hf_" + "a" * 34]}
    assert SCANNER.find(document) == [("a.2", "a Hugging Face token (hf_...)")]


@pytest.mark.parametrize("document", ["éAKIAABCDEFGHIJKLMNOP", "ésk-ant-" + "a" * 34])
def test_strings_hypothesis_once_found_are_named_as_the_engine_alone_names_them(document: str) -> None:
    # RE2's \b is ASCII's: after 'é' the rules that start with \b match, as Python's re's would not.
    for scanner in (SCANNER, BUILTIN):
        assert scanner.find(document) == reference(scanner, document)


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_whether_any_rule_matches_is_answered_in_one_call_as_every_rule_apart_would(text: str) -> None:
    # compile_any (RE2's FilteredRE2) skips a rule only when the literals it needs are absent: the
    # scan's fast "nothing here" (issue 52) must never hide what a rule alone finds.
    for scanner in (SCANNER, BUILTIN):
        apart = any(compile_pattern(pattern).search(text) is not None for _, pattern in scanner.rules.values())
        assert scanner._any is not None and scanner._any(text) == apart
        raw = text.encode()
        assert scanner.may_hold(raw) == (
            b"\\" in raw or any(automaton.search(raw) is not None for automaton in scanner._raw)
        )


def test_a_credential_in_a_text_that_also_holds_others_literals_is_still_found() -> None:
    assert (
        SCANNER._any is not None and not SCANNER._any("bad-12345") and not SCANNER.may_hold(b'{"request_id": "bad-1"}')
    )
    assert SCANNER.kind("token ghp_" + "a" * 36) == "a GitHub token" and SCANNER.may_hold(
        b'{"t": "ghp_' + b"a" * 36 + b'"}'
    )


@settings(max_examples=400, deadline=None)
@given(TEXTS)
def test_one_texts_kind_is_what_the_scan_of_texts_says(text: str) -> None:
    # `kind` answers a text no rule matches without `kinds`' lists (issue 52): the same verdicts,
    # the base64-hidden ones included.
    for scanner in (SCANNER, BUILTIN):
        assert scanner.kind(text) == scanner.kinds([text]).get(0)
    assert (
        SCANNER.kind("aGZfYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWFhYWE=")
        == "a Hugging Face token (hf_...), base64-encoded"
    )


KEY_PIECES = [
    "hf",
    "_",
    "token",
    "TOKEN",
    "izer",
    "pass",
    "word",
    "api",
    "Key",
    "max",
    "é",
    "\u200b",
    "x",
    "metadata",
    "\\u0074",
]
KEYS = st.lists(st.sampled_from(KEY_PIECES), min_size=1, max_size=4).map("".join)
KEYED = st.recursive(
    TEXTS | st.integers(),
    lambda inner: st.dictionaries(KEYS | TEXTS, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=400, deadline=None)
@given(KEYED, st.booleans())
def test_the_screen_answers_what_the_rules_and_the_key_names_say_apart(document: Any, ascii_only: bool) -> None:
    # One pass of RE2 for both (issue 52) must answer exactly what each says alone.
    raw = json.dumps(document, ensure_ascii=ascii_only).encode()
    for scanner in (SCANNER, BUILTIN):
        assert scanner.screen(raw) == (scanner.may_hold(raw), scanner.keys.may_hold(raw))
    assert SCANNER.screen(b'{"metadata": {"HF_TOKEN": "x"}}') == (False, True)
    assert SCANNER.screen(b'{"t": "ghp_' + b"a" * 36 + b'"}') == (True, False)


NUMBERS = (
    st.integers(min_value=-(10**21), max_value=10**21)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([10**19, -(10**18) * 9, 1e300, 2.5e-308, "\ud800", "e123", "E+999"])
)
LEAVES = st.recursive(
    TEXTS | NUMBERS,
    lambda inner: st.dictionaries(KEYS | TEXTS, inner, max_size=4) | st.lists(inner, max_size=3),
    max_leaves=10,
)


@settings(max_examples=400, deadline=None)
@given(KEYED | LEAVES, st.booleans())
def test_the_screen_with_decodes_suspect_leaf_answers_what_each_search_says_apart(
    document: Any, ascii_only: bool
) -> None:
    # decode_request's check for leaves no request may hold rides on the screen's pass (issue 52):
    # the three answers are those of `screen` and of the pattern searched alone.
    raw = json.dumps(document, ensure_ascii=ascii_only).encode(
        "utf-8", "surrogatepass"
    )  # a lone surrogate as a producer's bytes
    alone = compile_pattern(SUSPECT_LEAF)
    for scanner in (SCANNER, BUILTIN):
        assert scanner.screen_with(raw, SUSPECT_LEAF) == (*scanner.screen(raw), alone.search(raw) is not None)
    assert SCANNER.screen_with(b'{"n": 12345678901234567890}', SUSPECT_LEAF) == (False, False, True)
    assert SCANNER.screen_with(b'{"api_key": 1e400, "t": "ghp_' + b"a" * 36 + b'"}', SUSPECT_LEAF) == (True, True, True)
    assert SCANNER.screen_with(b'{"n": 1234567890}', SUSPECT_LEAF) == (False, False, False)
