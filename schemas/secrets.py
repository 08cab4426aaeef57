"""Credentials have no place in a request: find values that look like one, anywhere in a document.

A request travels through Kafka, the DLQ, logs and every event (its `metadata` is echoed), so a
token put in it by mistake would reach every consumer. `SecretScanner.find` walks the decoded JSON
and names the path of each credential-looking string (or key) and what kind it looks like, never the
value itself: callers put the path and the kind in a `rejected` event, and nothing else.

The rules are the shapes the issuers publish for their tokens (the same ones gitleaks' and
detect-secrets' rules describe), each anchored on its literal prefix and with every repetition
bounded, so a scan costs a bounded number of steps per character whatever the text: every message
on the requests topic passes through here, on the daemon's event loop. `metadata` values are also
judged by their entropy, since a free-form field is where an unlabelled secret goes. And a value
under a key whose name says it holds a credential (`hf_token`, `password`, `x-api-key`) is one,
whatever its shape (schemas/secret_keys.py).
"""

from __future__ import annotations

import base64
import binascii
import math
import re
from collections import Counter
from typing import Any

from schemas.regex import compile_pattern
from schemas.secret_keys import CredentialKeys

# kind → (what the rejection says, the pattern). Each needs the credential's own shape, so that
# ordinary text (a prompt about "tokens", a sentence with "bearer") does not trip them.
_PATTERNS: dict[str, tuple[str, str]] = {
    # Hugging Face: also glued to a word ("xhf_..."), as tokens pasted into a sentence are.
    "hf": ("a Hugging Face token (hf_...)", r"hf_[A-Za-z0-9]{30,64}"),
    "aws": ("an AWS access key id (AKIA.../ASIA...)", r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b"),
    "aws_secret": ("an AWS secret access key", r"(?i:aws.{0,24}secret.{0,24}?)[\"'=: ]{1,5}[A-Za-z0-9/+]{40}\b"),
    "key": ("a private key (-----BEGIN ... PRIVATE KEY-----)", r"-----BEGIN [A-Z0-9 ]{0,32}PRIVATE KEY-----"),
    "bearer": ("a bearer token", r"(?i:\bBearer\s{1,8}[A-Za-z0-9\-._~+/]{16,}=*)"),
    "basic": ("an HTTP basic-auth header", r"(?i:authorization\W{0,4}basic\s{1,8}[A-Za-z0-9+/]{8,}={0,2})"),
    "github": ("a GitHub token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})"),
    "gitlab": ("a GitLab token (glpat-...)", r"\bgl(?:pat|ptt|dt|rt)-[A-Za-z0-9_-]{20,64}"),
    "openai": ("an OpenAI key (sk-...)", r"\bsk-(?:(?:proj|svcacct|admin)-[A-Za-z0-9_-]{20,}|[A-Za-z0-9]{32,})"),
    "anthropic": ("an Anthropic key (sk-ant-...)", r"\bsk-ant-[A-Za-z0-9_-]{20,}"),
    "slack": ("a Slack token or webhook", r"\bxox[abposre]-[A-Za-z0-9-]{10,}|hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_-]{20,}"),
    "google": ("a Google API key (AIza...)", r"\bAIza[0-9A-Za-z_-]{35}"),
    "stripe": ("a Stripe key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"),
    "jwt": ("a JSON Web Token", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "azure": ("an Azure storage key or SAS signature", r"(?i:AccountKey=)[A-Za-z0-9+/]{20,}={0,2}|[?&]sig=[A-Za-z0-9%+/]{20,}"),
    # Bounded on both sides of '://': unbounded, a long scheme-like run ("a-a-a-...") is retried at every
    # character (quadratic on Python's re; issue 22 measured 14 s for 40 KB).
    "url": ("a URL with a password in it", r"(?i:\b[a-z][a-z0-9+.-]{0,31}://[^/\s:@]{1,256}:[^/\s@]{1,256}@)"),
    "query": ("a URL with a credential in its query", r"(?i:[?&](?:access_token|token|api_key|apikey|password|secret|client_secret)=)[^&#\s\"']{8,}"),
}
# A metadata value that is one long token of base64's alphabet, with letters of both cases and
# digits, and close to random (bits per character): a key or a password, whatever its issuer.
_TOKEN = r"[A-Za-z0-9+/_]"  # base64's alphabet, and the URL-safe one's underscore
_TOKEN_LIKE = re.compile(_TOKEN + r"{32,512}={0,2}")
_MIN_ENTROPY = 4.3


class SecretScanner:
    """Rules of credential shapes (kind → (what a rejection says, an RE2 pattern)), run as one
    pattern, so that a string is scanned once. On RE2 (schemas/regex.py) that is one automaton,
    about a hundred times faster than Python's re on this alternation; a producer without RE2 gets
    the same verdicts from re for the built-in rules, since every one is bounded. The daemon adds
    a maintained rule set to these (daemon/admission/secret_rules.py). `keys`: the rule on key
    names (the built-in keywords unless given; the daemon adds detect-secrets' list)."""

    def __init__(self, rules: dict[str, tuple[str, str]], keys: CredentialKeys | None = None) -> None:
        self.rules = rules
        self.keys = keys or CredentialKeys()
        alternation = "|".join(f"(?P<{name}>{pattern})" for name, (_, pattern) in rules.items())
        self._any = compile_pattern(alternation)
        # Over raw bytes, one search also looks for a whole string that is a token of base64's
        # alphabet (32 to 512 characters), which may hide a credential encoded: the only strings the
        # walk decodes (`_encoded_kind`). A longer run inside a string (an inline image's data URI)
        # is never decoded, so it need not make the walk run. A search through the RE2 wrapper costs
        # microseconds however short the text, so one search a message, not two.
        self._raw = compile_pattern(f'{alternation}|"{_TOKEN}{{32,512}}={{0,2}}"'.encode())

    def may_hold(self, raw: bytes) -> bool:
        """False only when no string of this JSON text can look like a credential. Without a
        backslash, every decoded string is a piece of the raw text, so the rules run over the raw
        bytes once (with each whole string of base64's alphabet, which may hide one encoded). JSON's escapes
        (`\\u`, `\\/`, `\\n`...) can spell or separate what a rule needs, so a text with one is
        always walked."""
        return b"\\" in raw or self._raw.search(raw) is not None

    def kind(self, value: str) -> str | None:
        """What kind of credential `value` looks like, or None."""
        found = self._any.search(value)
        if found is not None and found.lastgroup:
            return self.rules[found.lastgroup][0]
        return self._encoded_kind(value)

    def _encoded_kind(self, value: str) -> str | None:
        """A credential hidden in base64: a whole token of that alphabet, decoded and scanned once."""
        if not 32 <= len(value) <= 512 or not _TOKEN_LIKE.fullmatch(value):
            return None
        try:
            decoded = base64.b64decode(value + "=" * (-len(value) % 4), validate=False).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
        found = self._any.search(decoded)
        return f"{self.rules[found.lastgroup][0]}, base64-encoded" if found is not None and found.lastgroup else None

    def find(self, document: Any, path: str = "") -> list[tuple[str, str]]:
        """(path, kind) of every credential-looking string in a decoded JSON document. A key that
        looks like one is reported at its parent's path: naming it would repeat the secret."""
        found: list[tuple[str, str]] = []
        if isinstance(document, str):
            kind = self.kind(document)
            if kind:
                found.append((path, kind))
        elif isinstance(document, dict):
            for key, value in document.items():
                key_kind = self.kind(str(key))
                if key_kind:
                    found.append((f"{path}.<key>" if path else "<key>", key_kind))
                    continue
                found += self.find(value, f"{path}.{key}" if path else str(key))
        elif isinstance(document, list):
            for index, item in enumerate(document):
                found += self.find(item, f"{path}.{index}" if path else str(index))
        return found

    def in_metadata(self, document: Any) -> list[tuple[str, str]]:
        """(path, kind) of each `metadata` value of a request document that looks like a random key:
        its values are free-form, so a secret without a known shape goes there."""
        metadata = document.get("metadata") if isinstance(document, dict) else None
        if not isinstance(metadata, dict):
            return []
        return [(f"metadata.{key}", "a random key (a high-entropy value)") for key, value in metadata.items()
                if isinstance(value, str) and high_entropy(value) and not self.kind(value)]  # those `find` names


    def under_credential_keys(self, document: Any, raw: bytes) -> list[tuple[str, str]]:
        """(path, kind) of each value under a key whose name says it holds a credential, anywhere in
        a request document (`raw`: its bytes, to skip the walk when no key can be one)."""
        if not self.keys.may_hold(raw):
            return []
        return self.keys.find(document, lambda key: self.kind(key) is not None)


def high_entropy(value: str) -> bool:
    """Whether a free-form value looks like a random key: one token of base64's alphabet, mixed
    case and digits, at `_MIN_ENTROPY` bits a character or more."""
    if not _TOKEN_LIKE.fullmatch(value):
        return False
    if not (any(c.isupper() for c in value) and any(c.islower() for c in value) and any(c.isdigit() for c in value)):
        return False
    counts = Counter(value)
    entropy = -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
    return entropy >= _MIN_ENTROPY


# The built-in rules, for producers (and the daemon's base).
BUILTIN = SecretScanner(_PATTERNS)


def secret_kind(value: str) -> str | None:
    """What kind of credential `value` looks like by the built-in rules, or None."""
    return BUILTIN.kind(value)
