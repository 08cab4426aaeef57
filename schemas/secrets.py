"""Credentials have no place in a request: find values that look like one, anywhere in a document.

A request travels through Kafka, the DLQ, logs and every event (its `metadata` is echoed), so a
token put in it by mistake would reach every consumer. `SecretScanner.find` walks the decoded JSON
and names the path of each credential-looking string (or key) and what kind it looks like, never the
value itself: callers put the path and the kind in a `rejected` event, and nothing else.

The rules (schemas/secret_patterns.py) are the shapes the issuers publish for their tokens (the same ones gitleaks' and
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
import bisect
import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

from .regex import compile_any, compile_matching, compile_pattern
from .secret_keys import CredentialKeys
from .secret_patterns import PATTERNS, shares_automaton

# A metadata value that is one long token of base64's alphabet, with letters of both cases and
# digits, and close to random (bits per character): a key or a password, whatever its issuer.
_TOKEN = r"[A-Za-z0-9+/_]"  # base64's alphabet, and the URL-safe one's underscore
_TOKEN_LIKE = re.compile(_TOKEN + r"{32,512}={0,2}")
_MIN_ENTROPY = 4.3


class SecretScanner:
    """Rules of credential shapes (kind → (what a rejection says, an RE2 pattern)). The rules that
    start with a literal run as one automaton, each other rule as its own (`shares_automaton`), so
    that no text multiplies their states: on RE2 (schemas/regex.py) a text is scanned in time linear
    in its length, a few milliseconds a MiB whatever its letters. A producer without RE2 gets the
    same verdicts from Python's re for the built-in rules, since every one is bounded. The daemon
    adds a maintained rule set to these (daemon/admission/secret_rules.py). `keys`: the rule on key
    names (the built-in keywords unless given; the daemon adds detect-secrets' list)."""

    def __init__(self, rules: dict[str, tuple[str, str]], keys: CredentialKeys | None = None) -> None:
        self.rules = rules
        self.keys = keys or CredentialKeys()
        self._order = {name: index for index, name in enumerate(rules)}  # a tie goes to the rule named first
        shared = [name for name, (_, pattern) in rules.items() if shares_automaton(pattern)]
        groups = [shared, *([name] for name in rules if name not in shared)] if shared else [[name] for name in rules]
        alternations = ["|".join(f"(?P<{name}>{rules[name][1]})" for name in group) for group in groups]
        self._automata = [compile_pattern(alternation) for alternation in alternations]
        # Over raw bytes, the same automata and one more, for a whole string that is a token of
        # base64's alphabet (32 to 512 characters), which may hide a credential encoded: the only
        # strings `kinds` decodes. A longer run inside a string (an inline
        # image's data URI) is never decoded, so it need not make the walk run.
        self._raw = [compile_pattern(alternation.encode()) for alternation in alternations]
        base64_string = f'"{_TOKEN}{{32,512}}={{0,2}}"'.encode()
        self._raw.append(compile_pattern(base64_string))
        # Whether any rule matches at all, in one call (schemas/regex.py `compile_any`): most texts
        # hold no credential, and on the rejection path a call an automaton (16 of them, each a
        # search through the RE2 wrapper's Python code) cost 3 times what 67ce75e's whole scan did (issue 52).
        self._any = compile_any([pattern for _, pattern in rules.values()])
        screens = [pattern.encode() for _, pattern in rules.values()] + [base64_string]
        self._any_raw = compile_any(screens)
        # `may_hold` and the key-name screen (`CredentialKeys.may_hold`) in one call (`screen`): every
        # message of the requests topic passes both, and each call through RE2's wrapper costs (issue 52).
        self._keys_index = len(screens)
        self._screens = [*screens, *([self.keys.screen_pattern] if self.keys.screen_pattern is not None else [])]
        self._screen = compile_matching(self._screens) if self.keys.screen_pattern is not None else None
        self._screens_with: dict[
            bytes, tuple[Any, Callable[[bytes], list[int]] | None]
        ] = {}  # `screen_with`'s, by pattern

    def may_hold(self, raw: bytes) -> bool:
        """False only when no string of this JSON text can look like a credential. Without a
        backslash, every decoded string is a piece of the raw text, so the rules run over the raw
        bytes once (with each whole string of base64's alphabet, which may hide one encoded). JSON's escapes
        (`\\u`, `\\/`, `\\n`...) can spell or separate what a rule needs, so a text with one is
        always walked."""
        if b"\\" in raw:
            return True
        return (
            self._any_raw(raw)
            if self._any_raw is not None
            else any(automaton.search(raw) is not None for automaton in self._raw)
        )

    def screen(self, raw: bytes) -> tuple[bool, bool]:
        """(`may_hold(raw)`, whether a key of the text may be credential-named: `CredentialKeys.may_hold`),
        the two answers of one pass of RE2 over the bytes where each took its own."""
        if self._screen is None or b"\\" in raw:
            return self.may_hold(raw), self.keys.may_hold(raw)
        found = self._screen(raw)  # ascending: the key screen, last, is found[-1] when it matched
        keys = bool(found) and found[-1] == self._keys_index
        return bool(found) and found[0] < self._keys_index, keys and self.keys.named_in(raw)

    def screen_with(self, raw: bytes, pattern: bytes) -> tuple[bool, bool, bool]:
        """`screen`'s two answers and whether `pattern` (over bytes) matches somewhere in the text, in
        the same pass of RE2 (decode_request's check for leaves no request may hold rides on it: a
        call of its own through RE2's wrapper cost a microsecond a message, issue 52). The matcher
        of each pattern is built at its first use and kept."""
        built = self._screens_with.get(pattern)
        if built is None:
            together = compile_matching([*self._screens, pattern]) if self._screen is not None else None
            built = self._screens_with[pattern] = (compile_pattern(pattern), together)
        alone, together = built
        if together is None or b"\\" in raw:  # as `screen` reads such a text: each answer apart
            return (*self.screen(raw), alone.search(raw) is not None)
        found = together(raw)  # ascending: `pattern` is last, the key screen before it
        extra = bool(found) and found[-1] == self._keys_index + 1
        keys = self._keys_index in found[-2:]
        return bool(found) and found[0] < self._keys_index, keys and self.keys.named_in(raw), extra

    def kind(self, value: str) -> str | None:
        """What kind of credential `value` looks like, or None."""
        if (
            self._any is not None
            and not self._any(value)
            and not (32 <= len(value) <= 512 and _TOKEN_LIKE.fullmatch(value))
        ):
            # What `kinds` answers for a text no rule matches and base64 cannot hide one in, without
            # its lists and joins: every message's key is judged here when its value has no request
            # id (1.2 against 2.9 us; issue 52).
            return None
        return self.kinds([value]).get(0)

    def kinds(self, texts: list[str]) -> dict[int, str]:
        """What kind of credential each of `texts` looks like, by its index, for those that look
        like one: the rules' kind, else a credential base64 hides in a whole token of that alphabet."""
        found = {index: self.rules[name][0] for index, name in self._first_rules(texts).items()}
        encoded = [
            index
            for index, text in enumerate(texts)
            if index not in found and 32 <= len(text) <= 512 and _TOKEN_LIKE.fullmatch(text)
        ]
        decoded = [_decoded(texts[index]) for index in encoded]
        hidden = self._first_rules([text or "" for text in decoded])
        found.update({encoded[at]: f"{self.rules[name][0]}, base64-encoded" for at, name in hidden.items()})
        return found

    def _first_rules(self, texts: list[str]) -> dict[int, str]:
        """The rule each text matches first (the leftmost match; at one place, the rule named
        first), by the text's index. The texts are searched as one, joined by newlines, so that the
        cost is each automaton's pass over their length, not a call per text and automaton; a match
        that reaches past its text (a rule that takes whitespace) is looked for again in each text
        it touches alone."""
        if not texts:
            return {}
        joined = "\n".join(texts)
        if self._any is not None and not self._any(joined):
            return {}  # no rule matches anywhere: the common case, in one call
        starts = list(itertools.accumulate((len(text) + 1 for text in texts[:-1]), initial=0))
        best: dict[int, tuple[int, int, str]] = {}  # index → (where in the text, the rule's order, the rule)

        def keep(index: int, start: int, name: str | None) -> None:
            if name is not None and (index not in best or (start, self._order[name]) < best[index][:2]):
                best[index] = (start, self._order[name], name)

        for automaton in self._automata:
            position = 0
            while position <= len(joined) and (found := automaton.search(joined, position)) is not None:
                first = bisect.bisect_right(starts, found.start()) - 1
                last = bisect.bisect_right(starts, max(found.end() - 1, found.start())) - 1
                if first == last and found.end() <= starts[first] + len(texts[first]):
                    keep(first, found.start() - starts[first], found.lastgroup)
                else:
                    for index in range(first, last + 1):
                        alone = automaton.search(texts[index])
                        if alone is not None:
                            keep(index, alone.start(), alone.lastgroup)
                position = starts[last] + len(texts[last]) + 1  # the next text: its first match is enough
        return {index: name for index, (_, _, name) in best.items()}

    def find(self, document: Any, path: str = "") -> list[tuple[str, str]]:
        """(path, kind) of every credential-looking string in a decoded JSON document. A key that
        looks like one is reported at its parent's path, and what it holds is not looked at: naming
        it would repeat the secret."""
        entries: list[tuple[str, str, int | None]] = []  # (path, text, for a key: the entry past its value)
        _strings(document, path, entries)
        kinds = self.kinds([text for _, text, _ in entries])
        found: list[tuple[str, str]] = []
        index = 0
        while index < len(entries):
            where, _, past_value = entries[index]
            kind = kinds.get(index)
            if kind is not None:
                found.append((where, kind))
                if past_value is not None:
                    index = past_value
                    continue
            index += 1
        return found

    def in_metadata(self, document: Any) -> list[tuple[str, str]]:
        """(path, kind) of each `metadata` value of a request document that looks like a random key:
        its values are free-form, so a secret without a known shape goes there."""
        metadata = document.get("metadata") if isinstance(document, dict) else None
        if not isinstance(metadata, dict):
            return []
        return [
            (f"metadata.{key}", "a random key (a high-entropy value)")
            for key, value in metadata.items()
            if isinstance(value, str) and high_entropy(value) and not self.kind(value)
        ]  # those `find` names

    def under_credential_keys(
        self, document: Any, raw: bytes, *, screened: bool | None = None
    ) -> list[tuple[str, str]]:
        """(path, kind) of each value under a key whose name says it holds a credential, anywhere in
        a request document (`raw`: its bytes, to skip the walk when no key can be one; `screened`:
        what `screen` said of them, when it was asked)."""
        if not (self.keys.may_hold(raw) if screened is None else screened):
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


def _strings(document: Any, path: str, entries: list[tuple[str, str, int | None]]) -> None:
    """Every string of a decoded JSON document, keys included, in order, as `find` reports them."""
    if isinstance(document, str):
        entries.append((path, document, None))
    elif isinstance(document, dict):
        for key, value in document.items():
            at = len(entries)
            entries.append((f"{path}.<key>" if path else "<key>", str(key), None))
            _strings(value, f"{path}.{key}" if path else str(key), entries)
            entries[at] = (*entries[at][:2], len(entries))
    elif isinstance(document, list):
        for index, item in enumerate(document):
            _strings(item, f"{path}.{index}" if path else str(index), entries)


def _decoded(token: str) -> str | None:
    """A whole token of base64's alphabet, decoded, when it decodes to text."""
    try:
        return base64.b64decode(token + "=" * (-len(token) % 4), validate=False).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


# The built-in rules, for producers (and the daemon's base).
BUILTIN = SecretScanner(PATTERNS)


def secret_kind(value: str) -> str | None:
    """What kind of credential `value` looks like by the built-in rules, or None."""
    return BUILTIN.kind(value)
