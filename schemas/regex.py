"""The regular-expression engine of the wire contract: RE2 where it is installed (adapterd installs
google-re2), Python's `re` otherwise.

RE2 matches in time linear in the text, whatever the pattern: a pattern a request supplies (a
`regex_match` reward) cannot backtrack catastrophically, and the secret scan's many rules run as
one automaton. A pattern is valid in a request when RE2 compiles it (no look-around, no
back-references, repetitions up to 1000); a producer without RE2 checks it with `re`, which takes
look-around too: the daemon, which always has RE2, has the last word.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

try:
    import re2 as engine

    _OPTIONS: Any = engine.Options()
    _OPTIONS.log_errors = False  # a refused pattern is the request's error, not a line on the daemon's stderr
except ImportError:  # pragma: no cover - a producer's environment without google-re2
    engine = re
    _OPTIONS = 0  # re.compile's flags

ENGINE = getattr(engine, "__name__", "re")  # the module imported above: re2, or re where it is not installed


def compile_pattern(pattern: str | bytes) -> Any:
    """Compile with the contract's engine."""
    return engine.compile(pattern, _OPTIONS)


def compile_any(patterns: Sequence[str] | Sequence[bytes]) -> Callable[[Any], bool] | None:
    """Whether any of `patterns` matches somewhere in a text, in one call: RE2's FilteredRE2 (the
    literals each pattern needs, found in one pass; then only the patterns whose literals are there,
    and those with none, each as its own automaton, so linear in the text as they are apart). None
    on Python's `re`, which has no such thing. It answers exactly what searching each pattern would:
    FilteredRE2 only skips a pattern that cannot match."""
    matcher = _filter(patterns)
    return None if matcher is None else lambda text: matcher.Match(text) is not None


def compile_matching(patterns: Sequence[str] | Sequence[bytes]) -> Callable[[Any], list[int]] | None:
    """Which of `patterns` match somewhere in a text, by their index in ascending order, in one call:
    RE2's FilteredRE2 as `compile_any` uses it, every pattern whose literals are there run to the end.
    None on Python's `re`."""
    matcher = _filter(patterns)
    return None if matcher is None else lambda text: matcher.Match(text) or []


def _filter(patterns: Sequence[str] | Sequence[bytes]) -> Any:
    """RE2's FilteredRE2 of `patterns`, compiled; None on Python's `re`."""
    if engine is re:  # pragma: no cover - a producer's environment without google-re2
        return None
    matcher = engine.Filter()
    for pattern in patterns:
        matcher.Add(pattern, _OPTIONS)
    matcher.Compile()
    return matcher


# A counted repetition of 1000 or more (RE2 stops at 1000): RE2 would read "a{4294967296}" as literal text,
# and Python's re raises OverflowError; either way it is not what the producer meant.
_LARGE_REPEAT = re.compile(r"\{\s*\d{4,}|\{\s*\d*\s*,\s*\d{4,}")


def library_pattern_problem(pattern: str) -> str | None:
    """Why a pattern a library runs with Python's `re` (PEFT's `target_modules`, transformers'
    `optim_target_modules`) cannot be accepted, or None: it must be one RE2 runs (so adapterd can
    match it itself, in linear time) and one Python's `re` compiles (what the library does)."""
    if len(pattern) > 1000:
        return f"a pattern of {len(pattern)} characters; at most 1000"
    problem = pattern_problem(pattern)
    if problem is None and engine is not re:
        try:
            re.compile(pattern)
        except Exception as exc:  # re.error, OverflowError, RecursionError: refused all the same
            return f"pattern does not compile (Python's re, which the library runs): {str(exc)[:200]}"
    return problem


def pattern_problem(pattern: str) -> str | None:
    """Why a request's pattern cannot be used, or None. Any failure to compile is a reason, never an
    exception: Python's `re` raises OverflowError and RecursionError as well as re.error."""
    if _LARGE_REPEAT.search(pattern):
        return "a counted repetition ({n}) of 1000 or more"
    try:
        compile_pattern(pattern)
    except Exception as exc:  # whatever the engine raises, the pattern is refused
        return f"pattern does not compile ({ENGINE}): {str(exc)[:200]}"
    return None
