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
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("a Hugging Face token (hf_...)", re.compile(r"\bhf_[A-Za-z0-9]{30,}\b")),
    ("an AWS access key id (AKIA.../ASIA...)", re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")),
    ("a private key (-----BEGIN ... PRIVATE KEY-----)", re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")),
    ("a bearer token", re.compile(r"\bBearer\s+[A-Za-z0-9\-._~+/]{16,}=*", re.IGNORECASE)),
    ("a GitHub token", re.compile(r"\bgh[pousr]_[A-Za-z0-9]{36,}\b")),
    ("a URL with a password in it", re.compile(r"\b[a-z][a-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@", re.IGNORECASE)),
]


def secret_kind(value: str) -> str | None:
    """What kind of credential `value` looks like, or None."""
    for kind, pattern in _PATTERNS:
        if pattern.search(value):
            return kind
    return None


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
