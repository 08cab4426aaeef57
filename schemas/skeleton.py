"""A name's skeleton: what it looks like, whatever characters spell it, so that a credential-named
key in lookalikes (fullwidth `ｐａｓｓｗｏｒｄ`, Cyrillic `а` in `pаssword`, a zero-width space inside
`token`) is judged as the name it shows (schemas/secret_keys.py).

Unicode's UTS #39 defines a string's skeleton through its confusables table (each character mapped
to the prototype it is confused with); the table is read from confusable-homoglyphs, a small
pure-Python package that ships it as data (schemas' one dependency besides pydantic, for this).
Here, in order:

1. default-ignorable characters are dropped (zero-width spaces and joiners, bidi marks, soft
   hyphens, variation selectors, Hangul fillers): they show nothing;
2. the caller's case split (`hfToken` → `hf_Token`) runs on the name as written, so that only a
   capital written in ASCII begins a word (a Kelvin sign, which NFKC makes `K`, does not: `toKen`
   stays one word);
3. NFKC: compatibility forms become the plain ones (`ｐ` → `p`, `ﬁ` → `fi`);
4. each character beyond ASCII is replaced by its UTS #39 prototype (`р` → `p`, `ι` → `i`), read
   in ASCII where either of its cases allows (`shown`); then the name is case-folded.

ASCII characters are left as they are, unlike a full UTS #39 skeleton (which maps `l` → `I`,
`0` → `O`, `rn` → `m`): the keywords judged are ASCII words, and folding ASCII into ASCII would
merge ordinary names (`tokenizer_length`) rather than unmask lookalikes. A name all in ASCII is
returned as it is, without loading the table.
"""

from __future__ import annotations

import functools
import unicodedata
from collections.abc import Callable

# Default_Ignorable_Code_Point (Unicode's DerivedCoreProperties) beyond the format characters
# (category Cf, which holds U+200B-U+200F, U+202A-U+202E, U+2060-U+2064, U+FEFF, U+00AD...):
# the combining grapheme joiner, Hangul fillers, Khmer inherent vowels, Mongolian variation
# selectors, variation selectors and the tag block's unassigned rest.
_IGNORABLE_RANGES = (
    (0x034F, 0x034F),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFFA0, 0xFFA0),
    (0xE0000, 0xE0FFF),
)


@functools.lru_cache(maxsize=8192)
def ignorable(char: str) -> bool:
    """Whether a character is default-ignorable: it shows nothing where it is."""
    code = ord(char)
    return unicodedata.category(char) == "Cf" or any(low <= code <= high for low, high in _IGNORABLE_RANGES)


def visible(text: str) -> str:
    """`text` without its default-ignorable characters."""
    return "".join(char for char in text if not ignorable(char))


@functools.cache
def prototypes() -> dict[str, str]:
    """Each character beyond ASCII that UTS #39 maps to another → its prototype.

    confusable-homoglyphs stores confusables.txt both ways (a source lists its one prototype, a
    prototype lists all its sources): a character listing one entry whose own list is longer, or
    which is a sequence (sources are single characters), is a source of it. Where two characters
    list only each other, which one the file names the source is not kept: either stands for
    both (the ASCII one, or else the lower code point), so that both get the same skeleton."""
    from confusable_homoglyphs.confusables import confusables_data as table  # type: ignore[import-untyped]  # no py.typed

    found: dict[str, str] = {}
    for char, entries in table.items():
        if len(char) != 1 or char.isascii() or len(entries) != 1:
            continue
        target = entries[0]["c"]
        if not target.isascii():
            target = visible(target)  # right-to-left entries come wrapped in bidi marks
        if not target or target == char:
            continue
        if (
            len(target) == 1
            and len(table.get(target, ())) == 1
            and (False, ord(char)) < (not target.isascii(), ord(target))
        ):
            continue  # a pair: `char` itself stands for both
        found[char] = target
    return found


def skeleton(name: str, split: Callable[[str], str] = lambda text: text) -> str:
    """`name` as it shows: ignorables dropped, NFKC, `split` (the caller's case split), each
    character beyond ASCII replaced by its prototype, case-folded. An ASCII name is only `split`
    and lowercased."""
    if name.isascii():
        return split(name).lower()
    # The case split reads the name as written: a capital that only NFKC makes ASCII (the Kelvin sign
    # in `toKen`) begins no word, or a lookalike could cut a keyword in two. NFKC may give an
    # ignorable back (U+3164 → U+1160).
    text = visible(unicodedata.normalize("NFKC", split(visible(name))))
    return "".join(shown(char) for char in text).casefold()  # prototypes hold no ignorable (`prototypes`)


@functools.lru_cache(maxsize=4096)
def shown(char: str) -> str:
    """The prototype of one character beyond ASCII (an ASCII one as it is), read in ASCII where
    either of its cases allows: the folded character's prototype (Greek `Ι` → `ι` → `i`, where `Ι`
    itself maps to `l`), else the character's own (Cyrillic `Т` → `T`, where its lowercase `т`
    maps to small capital `ᴛ`, as UTS #39 has it)."""
    if char.isascii():
        return char
    table = prototypes()
    folded = "".join(table.get(part, part) for part in char.casefold())
    return folded if folded.isascii() else table.get(char, char)
