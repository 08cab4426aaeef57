"""Credentials have no place in a request: find values that look like one, anywhere in a document.

A request travels through Kafka, the DLQ, logs and every event (its `metadata` is echoed), so a
token put in it by mistake would reach every consumer. `find_secrets` walks the decoded JSON and
names the path of each credential-looking string (or key) and what kind it looks like, never the
value itself: callers put the path and the kind in a `rejected` event, and nothing else.
"""

from __future__ import annotations

import re
from typing import Any

# What each kind looks like. Kept specific enough that ordinary text (a prompt about "tokens", a
# sentence with "bearer") does not trip them: each needs the credential's own shape.
_PATTERNS: dict[str, tuple[str, str]] = {
    "hf": ("a Hugging Face token (hf_...)", r"\bhf_[A-Za-z0-9]{30,}\b"),
    "aws": ("an AWS access key id (AKIA.../ASIA...)", r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b"),
    "key": ("a private key (-----BEGIN ... PRIVATE KEY-----)", r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----"),
    "bearer": ("a bearer token", r"(?i:\bBearer\s+[A-Za-z0-9\-._~+/]{16,}=*)"),
    "github": ("a GitHub token", r"\bgh[pousr]_[A-Za-z0-9]{36,}\b"),
    "url": ("a URL with a password in it", r"(?i:\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@)"),
}
# All of them in one pattern, so that a string is scanned once: every message on the requests
# topic passes through here, and intake throughput is bound by this and validation.
_ANY = re.compile("|".join(f"(?P<{name}>{pattern})" for name, (_, pattern) in _PATTERNS.items()))


# What every pattern above needs to find in the raw JSON, one literal at least. A raw message
# without any of them holds no credential-looking string, so most messages skip the walk. JSON's
# escapes are the catch: `\u` can spell any of these literals, and `\/` the slashes, so a raw
# message with either is always walked.
_TRIGGERS = re.compile(rb"hf_|AKIA|ASIA|PRIVATE KEY|(?i:bearer)|gh[pousr]_|:/|\\u|\\/")


def may_hold_secrets(raw: bytes) -> bool:
    """False only when no string in this JSON text can look like a credential: a cheap test on the raw bytes."""
    return _TRIGGERS.search(raw) is not None


def secret_kind(value: str) -> str | None:
    """What kind of credential `value` looks like, or None."""
    found = _ANY.search(value)
    return _PATTERNS[found.lastgroup][0] if found is not None and found.lastgroup else None


def find_secrets(document: Any, path: str = "") -> list[tuple[str, str]]:
    """(path, kind) of every credential-looking string in a decoded JSON document. A key that looks
    like one is reported at its parent's path: naming it would repeat the secret."""
    found: list[tuple[str, str]] = []
    if isinstance(document, str):
        kind = secret_kind(document)
        if kind:
            found.append((path, kind))
    elif isinstance(document, dict):
        for key, value in document.items():
            key_kind = secret_kind(str(key))
            if key_kind:
                found.append((f"{path}.<key>" if path else "<key>", key_kind))
                continue
            found += find_secrets(value, f"{path}.{key}" if path else str(key))
    elif isinstance(document, list):
        for index, item in enumerate(document):
            found += find_secrets(item, f"{path}.{index}" if path else str(index))
    return found
