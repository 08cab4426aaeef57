"""The regular expressions of a request's `peft` block, matched by adapterd with RE2 before PEFT
sees them. PEFT runs a string `target_modules` or `exclude_modules` with Python's `re.fullmatch`,
and each key of `rank_pattern` / `alpha_pattern` with `re.match(rf"(.*\\.)?({key})$")`, on every
module name: a pattern such as `([a-z._0-9]+)+Z` backtracks for seconds per name, doubling with each
character. RE2 matches in linear time, so each pattern is replaced here by the exact module names it
matches (a list for the first two, escaped names for the keys), which PEFT compares as plain text.
Intake has already refused what RE2 or Python's re cannot compile (schemas/request_base.py)."""

from __future__ import annotations

import re
from typing import Any

from handlers.protocol import JobFailed
from schemas.regex import compile_pattern


def resolved(fields: dict[str, Any], module_names: list[str]) -> dict[str, Any]:
    """`fields` (LoraConfig's keyword arguments) with each pattern replaced by what it matches among
    `module_names` (the base model's `named_modules()`, as PEFT walks them)."""
    fields = dict(fields)
    for name in ("target_modules", "exclude_modules"):
        pattern = fields.get(name)
        if isinstance(pattern, str) and not (name == "target_modules" and pattern == "all-linear"):
            compiled = compile_pattern(pattern)
            matched = [module for module in module_names if compiled.fullmatch(module)]
            if name == "target_modules" and not matched:
                raise JobFailed(
                    "config_invalid",
                    "load_model",
                    f"peft.target_modules: {pattern[:200]!r} matches no module of the model",
                )
            fields[name] = matched
    for name in ("rank_pattern", "alpha_pattern"):
        patterns = fields.get(name)
        if patterns:
            fields[name] = _by_module(patterns, module_names)
    return fields


def _by_module(patterns: dict[str, Any], module_names: list[str]) -> dict[str, Any]:
    """Each module's value under the first key that matches it, as PEFT picks it, keyed by the
    module's own name, escaped: PEFT still reads the key as a pattern."""
    compiled = [(compile_pattern(rf"(?:.*\.)?(?:{key})"), value) for key, value in patterns.items()]
    found: dict[str, Any] = {}
    for module in module_names:
        value = next((value for pattern, value in compiled if pattern.fullmatch(module)), None)
        if value is not None:
            found[re.escape(module)] = value
    return found
