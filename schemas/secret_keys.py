"""Credential-named keys: a value under a key whose name says it holds a credential (`hf_token`,
`password`, `x-api-key`...) is a credential, whatever its shape.

The shape rules (schemas/secret_patterns.py) know what issuers' tokens look like; a short or made-up value
(`{"hf_token": "hf_SECRET"}`) has no such shape, yet a producer who wrote it meant a credential, and
`metadata` is echoed in every event. So every key of a request, in `metadata` and in every other
mapping it carries (the TRL blocks' `*_kwargs` and `*_config`, `dataset.columns`, inline rows...),
is judged by its name. Every key and not a list of free-form fields: a mapping TRL adds later is
covered too, and a test checks that no field name of the contract trips the rule (`hub_token`,
refused anyway, excepted).

A key's name is first taken by its skeleton (schemas/skeleton.py: zero-width characters dropped,
NFKC, Unicode's confusables: fullwidth `ｐａｓｓｗｏｒｄ`, Cyrillic `а` in `pаssword` and `to\u200bken` are
the names they show) and split into lowercase words (`hfToken`, `HF-TOKEN`, `hf.token` → `hf_token`),
then one RE2 pattern judges it, by three kinds of keyword:

- Anywhere in the name (`KEYWORDS`): detect-secrets' keyword list where the daemon scans (the daemon
  adds it: daemon/admission/secret_rules.py), and a few of the same (`password`, `secret`,
  `api_?key`...) for a producer without detect-secrets, and `access_?key`, `connection_?string`.
  detect-secrets matches them anywhere in a name too; its list has no `token` and no `auth`.
- As the name's last word, or the end of it (`WORDS`): `token`, `auth`, `authorization`,
  `credential(s)`, `bearer`, `passphrase`, `cookie`. Last, because a machine-learning name holds
  these words for other things: `tokenizer`, `tokenizer_name`, `max_tokens`, `num_tokens` end in
  another word (`tokenizer`, `name`, `tokens`), `token_type_ids` has `token` first, `author` is not
  `auth`. A glued prefix counts (`hftoken`, `HFToken`, `oauth`).
- As the name's last word, whole (`WHOLE_WORDS`): `pass`, `session`, `jwt`, `dsn`. Whole, because
  glued they end unrelated words (`bypass`, `compass`, `obsession`); last, because first they
  start them (`pass_threshold`).

A tokenizer's tokens are text, not credentials: a name ending in `token` is one when the word
before it says which token of a text it is (`HARMLESS_TOKENS`, `MARKERS`): a begin-, end- or
start-of marker (`bos`, `eos`, `eot`, `eom`, `boi`: `b`, `e` or `s`, then `o`, then the letter of
what it bounds; `bot` excepted, Slack's and Telegram's bot credential), a tokenizer's other
special tokens (`pad`, `unk`, `mask`, `stop`, `blank`, `word_delimiter`...), a part of a prompt (`fim_prefix`,
`assistant`, `chat_template`, `turn`, `tool`...), a modality (`image`, `audio`...), or a count (`max_token`);
or when a part of a text comes earlier in the name (`tool_call_token`, `image_break_token`: `TOKENIZER_PARTS`)
and the word before `token` is not whose credential it is (`image_api_token`, `tool_auth_token` are refused:
`CREDENTIAL_OWNERS`). A keyword anywhere still wins (`secret_pad_token`), and `token`, `hf_token`,
`api_token`, `access_token` stay credentials.

A value counts when it holds something: a non-empty string or a number, or a list or mapping with
one inside (`{"auth": {"user": "u", "pass": "p"}}`). `{"use_auth": true}`, `{"token": null}` and
`{"password": ""}` carry no credential. The rejection names the key's path, never the value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from .regex import compile_pattern
from .skeleton import skeleton

# Judged anywhere in a key's words; regex fragments over lowercase words joined by `_`, as
# detect-secrets writes its own (`api_?key` covers `api_key`, `apiKey`, `x-api-key`, `APIKEY`).
KEYWORDS: tuple[str, ...] = (
    "password",
    "passwd",
    "secret",
    "api_?key",
    "private_?key",
    "access_?key",
    "connection_?string",
)
# Judged as a key's last word (or the end of its last word): what adapterd adds to detect-secrets' list.
WORDS: tuple[str, ...] = ("token", "auth", "authorization", "credentials?", "bearer", "passphrase", "cookie")
# Judged as a key's whole last word: glued to another word they end unrelated words (`bypass`).
WHOLE_WORDS: tuple[str, ...] = ("pass", "session", "jwt", "dsn")
# The word before `token` that says which token of a text it is, for a tokenizer or a TRL field
# (`stop_token`): its special tokens, the parts of a prompt, modalities, counts. Not credentials.
HARMLESS_TOKENS: tuple[str, ...] = (
    "pad",
    "unk",
    "sep",
    "cls",
    "mask",
    "stop",
    "start",
    "end",
    "special",
    "prefix",
    "middle",
    "suffix",
    "template",
    "turn",
    "assistant",
    "think",
    "tool",
    "image",
    "img",
    "video",
    "audio",
    "vision",
    "tile",
    "max",
    "min",
    "num",
    "delimiter",
    "utterance",
    "blank",
    "fill",
)
# A name whose words before `<word>_token` hold one of these is a token of a text's part (`tool_call_token`,
# `image_break_token`, `audio_delay_token`, `img_line_break_token`: transformers' processors' names)...
TOKENIZER_PARTS: tuple[str, ...] = ("tool", "image", "img", "video", "audio", "vision", "tile", "patch", "chat")
# ...unless `<word>` says whose credential it is (`image_api_token`, `tool_auth_token`, `vision_hf_token`).
CREDENTIAL_OWNERS = frozenset(
    (
        "api",
        "access",
        "auth",
        "oauth",
        "bearer",
        "refresh",
        "session",
        "hf",
        "hub",
        "bot",
        "id",
        "csrf",
        "xsrf",
        "service",
        "client",
        "user",
        "app",
        "personal",
        "login",
        "github",
        "gitlab",
        "gh",
        "slack",
        "secret",
        "private",
        "upload",
        "download",
        "storage",
        "sas",
        "write",
        "read",
    )
)
# Begin-, end- and start-of markers (`bos`, `eot`, `eom`, `boi`, `sot`), as an RE2 fragment; `bot`
# left out: a bot's token is the credential of Slack's and Telegram's bots.
MARKERS = "bo[a-su-z]|[es]o[a-z]"
KIND = "a credential: its key's name says it holds one"

# Word boundaries: a lowercase letter or digit before a capital (`hfToken`), and any run of ASCII
# punctuation, spaces or underscores (`HF-TOKEN`, `hf.token`, `hf__token`). Letters beyond ASCII
# stay as they are (detect-secrets lists `contraseña`).
_CAMEL = compile_pattern(r"([a-z0-9])([A-Z])")
_SEPARATORS = compile_pattern(r"[\x00-\x2f\x3a-\x40\x5b-\x60\x7b-\x7f]+")
_CACHE_BOUND = 4096  # distinct key names remembered: inline rows repeat a few names thousands of times


def words(key: str) -> str:
    """A key's name by its skeleton, as lowercase words joined by `_`: `hfToken`, `HF-TOKEN`,
    `ＨＦ＿ＴＯＫＥＮ`, `hf_tоken` (Cyrillic `о`) → `hf_token`."""
    return _SEPARATORS.sub("_", skeleton(key, _split_camel).lower()).strip("_")


def _split_camel(name: str) -> str:
    return _CAMEL.sub(r"\1_\2", name)


class CredentialKeys:
    """The key-name rule: `keywords` anywhere in a name, `words` as its last word (or its end),
    `whole_words` as its whole last word, by the name's skeleton, as one RE2 pattern."""

    def __init__(
        self, keywords: Iterable[str] = KEYWORDS, words: Iterable[str] = WORDS, whole_words: Iterable[str] = WHOLE_WORDS
    ) -> None:
        # Keywords beyond ASCII (detect-secrets' `contraseña`) are judged by their skeleton too.
        self.keywords = tuple(dict.fromkeys(_skeleton_fragment(keyword) for keyword in keywords))
        self.words = tuple(_skeleton_fragment(word) for word in words)
        self.whole_words = tuple(_skeleton_fragment(word) for word in whole_words)
        anywhere, last, whole = "|".join(self.keywords), "|".join(self.words), "|".join(self.whole_words)
        harmless = "|".join((*HARMLESS_TOKENS, MARKERS))
        # Alternatives are tried in order, all anchored at the start: a keyword anywhere wins over a
        # special token's name (`secret_pad_token` is refused), which wins over a last word.
        self._rule = compile_pattern(
            rf"^(?:.*?(?P<anywhere>{anywhere})|(?:.*_)?(?P<harmless>(?:{harmless})_token)$"
            rf"|(?:.*_)?(?P<whole>{whole})$|(?:.*_)?[^_]*?(?P<last>{last})$)"
        )
        # Over a message's raw bytes, the keys that hold a keyword's letters (the last piece of each,
        # in any case) or a character beyond ASCII (a lookalike, or a zero-width one, may hide a
        # keyword's letters): a string followed by ':' is a key, and JSON outside strings (true,
        # null, numbers) cannot spell one. Most messages have none; the others' few are judged by name.
        stems = [_stem(keyword) for keyword in (*self.keywords, *self.words, *self.whole_words)]
        alternatives = "|".join((*dict.fromkeys(stems), r"[^\x00-\x7f]"))
        self.screen_pattern = rf'"([^"\\]*(?i:{alternatives})[^"\\]*)"\s*:'.encode() if all(stems) else None
        self._keys = compile_pattern(self.screen_pattern) if self.screen_pattern is not None else None
        self._verdicts: dict[str, bool] = {}

    def names_credential(self, key: str) -> bool:
        """Whether `key`'s name says it holds a credential."""
        verdict = self._verdicts.get(key)
        if verdict is None:
            name = words(key)
            found = self._rule.search(name)
            verdict = (
                found is not None
                and found.lastgroup != "harmless"
                and not (found.lastgroup == "last" and _a_texts_token(name))
            )
            if len(self._verdicts) >= _CACHE_BOUND:
                self._verdicts.clear()
            self._verdicts[key] = verdict
        return verdict

    def may_hold(self, raw: bytes) -> bool:
        """False only when no key of this JSON text is credential-named: the keys that hold a
        keyword's letters are read from the raw text and judged, so the walk (`find`) runs only to
        name the ones that are. A text with a backslash is always walked: an escape can spell or
        hide a name (`hf_\\u0074oken`) or a quote."""
        if self._keys is None or b"\\" in raw:
            return True
        return self.named_in(raw)

    def named_in(self, raw: bytes) -> bool:
        """Whether a key read from a JSON text without escapes (`may_hold`) is credential-named: the
        keys that hold a keyword's letters (`screen_pattern`), each judged by its name."""
        assert self._keys is not None  # only where `may_hold` reads the text
        keys = self._keys.findall(raw)
        return bool(keys) and any(self.names_credential(key.decode("utf-8", "replace")) for key in keys)

    def find(self, document: Any, hides: Callable[[str], bool]) -> list[tuple[str, str]]:
        """(path, kind) of each value under a credential-named key, anywhere in a decoded JSON
        document. `hides(key)`: whether a key is itself a credential by its shape; such a key is
        written `<key>` in a path, so that the path never repeats it."""
        found: list[tuple[str, str]] = []
        self._walk(document, (), hides, found)
        return found

    def _walk(
        self, node: Any, path: tuple[str, ...], hides: Callable[[str], bool], found: list[tuple[str, str]]
    ) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if self.names_credential(key):
                    if _holds_value(value):
                        found.append((".".join("<key>" if hides(part) else part for part in (*path, key)), KIND))
                elif isinstance(value, dict | list):  # only containers hold more keys
                    self._walk(value, (*path, key), hides, found)
        elif isinstance(node, list):
            for index, item in enumerate(node):
                if isinstance(item, dict | list):
                    self._walk(item, (*path, str(index)), hides, found)


def _a_texts_token(name: str) -> bool:
    """Whether a name judged by its last word `token` names a token of a text's part rather than a credential:
    `<...>_<part>_<...>_<word>_token`, a part of TOKENIZER_PARTS before the word, the word no credential's owner."""
    parts = name.split("_")
    return (
        len(parts) >= 3
        and parts[-1] == "token"
        and parts[-2] not in CREDENTIAL_OWNERS
        and any(p in TOKENIZER_PARTS for p in parts[:-2])
    )


def _skeleton_fragment(fragment: str) -> str:
    """A regex fragment with its characters beyond ASCII by their prototypes, as names are judged;
    its ASCII (the regex syntax) as it is."""
    return fragment if fragment.isascii() else "".join(char if char.isascii() else skeleton(char) for char in fragment)


def _stem(keyword: str) -> str:
    """The letters a name judged by `keyword` holds for certain: its last piece (`api_?key` → `key`),
    an optional last letter left off (`credentials?` → `credential`), up to its first letter beyond
    ASCII (`contraseña` → `contrase`: case-folding the raw bytes is ASCII's only). Empty when the
    keyword has other regex syntax than these: then every message is walked."""
    stem = keyword.split("_?")[-1]
    stem = stem[:-2] if stem.endswith("?") else stem
    ascii_part = stem[: next((i for i, c in enumerate(stem) if not c.isascii()), len(stem))]
    return ascii_part if stem.isalnum() and ascii_part.isalnum() else ""


def _holds_value(value: Any) -> bool:
    """Whether a value carries something a credential could be: a non-empty string, a number, or
    a list or mapping holding one. Not null, a boolean or an empty string."""
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, str):
        return value != ""
    if isinstance(value, int | float):
        return True
    if isinstance(value, dict):
        return any(_holds_value(item) for item in value.values())
    if isinstance(value, list):
        return any(_holds_value(item) for item in value)
    return False
