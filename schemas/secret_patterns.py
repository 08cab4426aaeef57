"""The built-in credential rules (kind → what a rejection says, the pattern), and which rules can
share one RE2 automaton (`shares_automaton`): what schemas/secrets.py's scanner runs.

Each rule is the shape an issuer publishes for its tokens (the same ones gitleaks' and
detect-secrets' rules describe), anchored on its literal prefix and with every repetition bounded,
so a scan costs a bounded number of steps per character whatever the text.
"""

from __future__ import annotations

import re

# kind → (what the rejection says, the pattern). Each needs the credential's own shape, so that
# ordinary text (a prompt about "tokens", a sentence with "bearer") does not trip them.
PATTERNS: dict[str, tuple[str, str]] = {
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
    "slack": (
        "a Slack token or webhook",
        r"\bxox[abposre]-[A-Za-z0-9-]{10,}|hooks\.slack\.com/(?:services|workflows)/[A-Za-z0-9/_-]{20,}",
    ),
    "google": ("a Google API key (AIza...)", r"\bAIza[0-9A-Za-z_-]{35}"),
    "stripe": ("a Stripe key", r"\b[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"),
    "jwt": ("a JSON Web Token", r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}"),
    "azure": (
        "an Azure storage key or SAS signature",
        r"(?i:AccountKey=)[A-Za-z0-9+/]{20,}={0,2}|[?&]sig=[A-Za-z0-9%+/]{20,}",
    ),
    # Bounded on both sides of '://': unbounded, a long scheme-like run ("a-a-a-...") is retried at every
    # character (quadratic on Python's re; issue 22 measured 14 s for 40 KB).
    "url": ("a URL with a password in it", r"(?i:\b[a-z][a-z0-9+.-]{0,31}://[^/\s:@]{1,256}:[^/\s@]{1,256}@)"),
    "query": (
        "a URL with a credential in its query",
        r"(?i:[?&](?:access_token|token|api_key|apikey|password|secret|client_secret)=)[^&#\s\"']{8,}",
    ),
}


# A rule that starts with a literal of this many characters or more runs in the shared automaton.
_ANCHOR = 3
_LEADING = re.compile(r"(?:\\b|\(\?i:|\(\?:|\^)*")
_LITERAL = re.compile(r"(?:[A-Za-z0-9_=:/ -]|\\[./-])+")


def shares_automaton(pattern: str) -> bool:
    """Whether a rule starts with a literal of `_ANCHOR` characters or more (after `\\b`, `^` and an
    opening `(?i:` or `(?:`): such rules run together as one automaton, which stays small, since
    each of its states waits on a literal. A rule that starts with a class and counts it
    (`[0-9a-z]{32}-us[0-9]{1,2}`, `[MNO][a-zA-Z\\d_-]{23,25}\\.`) is begun again at every character of a
    run of that class, and several of them together multiply their states: each runs apart. As one
    automaton, detect-secrets' rules and adapterd's took 1.4 s a MiB of random letters (RE2's cache
    filled again and again, and it fell back to its slower engine); apart, 30 ms
    (`benchmarks.record_intake`)."""
    rest = pattern[_LEADING.match(pattern).end() :]  # type: ignore[union-attr]  # matches the empty string
    literal = _LITERAL.match(rest)
    return literal is not None and len(literal.group(0).replace("\\", "")) >= _ANCHOR
