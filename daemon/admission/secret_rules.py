"""The credential rules intake scans every request with: adapterd's own (schemas/secret_patterns.py) and
Yelp's detect-secrets, a maintained rule set of some twenty issuers' token shapes.

Every regex-based detect-secrets plugin contributes its published `denylist`, run on RE2 with the
built-in rules as one automaton (linear time, on the event loop). detect-secrets' own scanner is
not used: it runs its patterns one by one on Python's re, and its entropy plugins and the keyword
plugin's regexes judge source code, not JSON values (the keyword plugin's list of names is used,
below). A pattern RE2 cannot compile (look-around) or written in
verbose mode is left out, and `LEFT_OUT` names it (the same on every host of a release; the
canary's tests notice when a release changes it). Why detect-secrets and not gitleaks: it is a Python package, installed
with adapterd from PyPI, whose rules are read at run time through its public plugin API, so they move with its releases;
gitleaks' rules live in a Go project's configuration.

Key names: detect-secrets' `KeywordDetector` (found by its secret type, `Secret Keyword`, in the same
plugin mapping) judges a line of code by the name a value is assigned to (`password = "..."`); its
keyword list (the `DENYLIST` of the plugin's module: `api_?key`, `auth_?key`, `service_?key`,
`account_?key`, `db_?key`, `database_?key`, `priv_?key`, `private_?key`, `client_?key`, `db_?pass`,
`database_?pass`, `key_?pass`, `password`, `passwd`, `pwd`, `secret`, `contraseña`, `contrasena` in
1.5) joins adapterd's own key-name rule (schemas/secret_keys.py), on RE2. Its regexes, which need
the code around a name (`=`, quotes), are not used: a JSON key is the name itself.
"""

from __future__ import annotations

import re
import sys

from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
from detect_secrets.plugins.base import RegexBasedDetector

from schemas.regex import pattern_problem
from schemas.secret_keys import KEYWORDS, CredentialKeys
from schemas.secrets import BUILTIN, SecretScanner


def detect_secrets_rules() -> tuple[dict[str, tuple[str, str]], list[str]]:
    """kind → (description, RE2 pattern) for each usable pattern of detect-secrets' regex plugins,
    and the patterns left out (plugin and why)."""
    rules: dict[str, tuple[str, str]] = {}
    left_out: list[str] = []
    plugins: dict[str, type] = get_mapping_from_secret_type_to_class()
    for secret_type, plugin in sorted(plugins.items()):
        if not issubclass(plugin, RegexBasedDetector):
            continue  # entropy and keyword plugins: not a shape to match
        for index, compiled in enumerate(plugin().denylist):
            if compiled.flags & re.VERBOSE:
                left_out.append(f"{plugin.__name__}[{index}]: verbose mode")
                continue
            pattern = f"(?i:{compiled.pattern})" if compiled.flags & re.IGNORECASE else compiled.pattern
            problem = pattern_problem(pattern)
            if problem:
                left_out.append(f"{plugin.__name__}[{index}]: {problem}")
                continue
            rules[f"ds_{plugin.__name__}_{index}"] = (f"a {secret_type} (detect-secrets)", pattern)
    return rules, left_out


def detect_secrets_keywords() -> tuple[list[str], list[str]]:
    """The key-name keywords of detect-secrets' keyword plugin that RE2 runs (regex fragments over
    lowercase words, `api_?key`), and those left out (why)."""
    keywords: list[str] = []
    left_out: list[str] = []
    plugins: dict[str, type] = get_mapping_from_secret_type_to_class()
    for plugin in plugins.values():
        if plugin.__name__ != "KeywordDetector":
            continue
        # the plugin's module-level list, found by its class: detect-secrets' API has no accessor for it
        for keyword in getattr(sys.modules[plugin.__module__], "DENYLIST", ()):
            problem = pattern_problem(keyword)
            if problem:
                left_out.append(f"{plugin.__name__}: {keyword}: {problem}")
            else:
                keywords.append(keyword)
    return keywords, left_out


_RULES, _LEFT_OUT_RULES = detect_secrets_rules()
KEYWORDS_DS, _LEFT_OUT_KEYWORDS = detect_secrets_keywords()
LEFT_OUT = _LEFT_OUT_RULES + _LEFT_OUT_KEYWORDS
# adapterd's rules first: where both match, the rejection says the more specific kind.
SCANNER = SecretScanner({**BUILTIN.rules, **_RULES}, CredentialKeys((*KEYWORDS, *KEYWORDS_DS)))
