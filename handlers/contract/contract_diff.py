"""What changed between two readings of the request's contract (schemas/trl_contract.json, as
`python -m handlers.contract.generate_contract` writes it), block by block:

    python -m handlers.contract.contract_diff OLD.json NEW.json              # type, choices, default changes
    python -m handlers.contract.contract_diff OLD.json NEW.json --help-text  # and help-text-only changes
    python3 handlers/contract/contract_diff.py OLD.json NEW.json             # the same, without the project's env

Each block prints its source and package version (old -> new), then one line per field: `+` added
(with its type and default), `-` removed, `~` changed (type, nullable, choices, default, nested
config class), and for the method blocks the training defaults the method's config changes
(`~ training default`). Help-text-only changes are counted but shown only with --help-text. The last
line is the count: `contract: N changes (...)`. The exit status is 0 whatever changed (changes are the
report; `.ci/canary` prints them); 2 when a file cannot be read.

Standard library only (it reads two JSON files), so `.ci/canary` runs it as a plain file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

COMPARED = ("type", "nullable", "choices", "default", "object")  # "help" only with --help-text


def _value(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _field_summary(spec: dict[str, Any]) -> str:
    text = f"{spec.get('type')}{' | None' if spec.get('nullable') and 'None' not in str(spec.get('type')) else ''}"
    text += f" = {_value(spec.get('default'))}"
    if spec.get("choices") is not None:
        text += f", one of {_value(spec['choices'])}"
    if spec.get("object"):
        text += f", object {spec['object']}"
    return text


def _choices_change(old: list[Any] | None, new: list[Any] | None) -> str:
    if old is None or new is None:
        return f"choices {_value(old)} -> {_value(new)}"
    added = [v for v in new if v not in old]
    removed = [v for v in old if v not in new]
    parts = [f"+{_value(v)}" for v in added] + [f"-{_value(v)}" for v in removed]
    return f"choices {' '.join(parts)}" if parts else "choices reordered"


def field_changes(old: dict[str, Any], new: dict[str, Any], *, help_text: bool) -> list[str]:
    """The `~` descriptions of one field that is in both readings (empty when nothing compared differs)."""
    changes = []
    for key in COMPARED + (("help",) if help_text else ()):
        before, after = old.get(key), new.get(key)
        if before == after:
            continue
        if key == "choices":
            changes.append(_choices_change(before, after))
        elif key == "help":
            changes.append(f"help:\n      was: {before}\n      now: {after}")
        else:
            changes.append(f"{key} {_value(before)} -> {_value(after)}")
    return changes


def diff_block(
    block: str, old: dict[str, Any], new: dict[str, Any], *, help_text: bool, counts: Counter[str]
) -> list[str]:
    """The lines for one block present in both readings (empty when nothing shown changed)."""
    lines = []
    old_fields, new_fields = old.get("fields", {}), new.get("fields", {})
    for name in sorted(new_fields.keys() - old_fields.keys()):
        lines.append(f"  + {name}: {_field_summary(new_fields[name])}")
        counts["added"] += 1
    for name in sorted(old_fields.keys() - new_fields.keys()):
        lines.append(f"  - {name}: was {_field_summary(old_fields[name])}")
        counts["removed"] += 1
    for name in sorted(old_fields.keys() & new_fields.keys()):
        changes = field_changes(old_fields[name], new_fields[name], help_text=help_text)
        if changes:
            lines.append(f"  ~ {name}: {'; '.join(changes)}")
            counts["changed"] += 1
        elif old_fields[name].get("help") != new_fields[name].get("help"):
            counts["help_only"] += 1
    old_defaults, new_defaults = old.get("training_defaults", {}), new.get("training_defaults", {})
    for name in sorted(old_defaults.keys() | new_defaults.keys()):
        if old_defaults.get(name, "<training's>") != new_defaults.get(name, "<training's>"):
            before = _value(old_defaults[name]) if name in old_defaults else "training's default"
            after = _value(new_defaults[name]) if name in new_defaults else "training's default"
            lines.append(f"  ~ training default {name}: {before} -> {after}")
            counts["training_defaults"] += 1
    if old.get("source") != new.get("source"):
        lines.insert(0, f"  ~ source {old.get('source')} -> {new.get('source')}")
        counts["changed"] += 1
    return lines


def _heading(block: str, old: dict[str, Any] | None, new: dict[str, Any] | None) -> str:
    section = new or old or {}
    before = old.get("version") if old else None
    after = new.get("version") if new else None
    versions = f"{before} -> {after}" if before != after else f"{after} (unchanged)"
    return f"{block} ({section.get('source')}, {section.get('package')} {versions})"


def diff(old: dict[str, Any], new: dict[str, Any], *, help_text: bool = False) -> tuple[list[str], Counter[str]]:
    """The report's lines and the counts by kind (added, removed, changed, training_defaults,
    blocks_added, blocks_removed, help_only)."""
    counts: Counter[str] = Counter()
    lines = []
    for block in sorted(old.keys() | new.keys()):
        if block not in old:
            lines.append(f"+ block {_heading(block, None, new[block])}: {len(new[block].get('fields', {}))} fields")
            counts["blocks_added"] += 1
        elif block not in new:
            lines.append(f"- block {_heading(block, old[block], None)}")
            counts["blocks_removed"] += 1
        else:
            body = diff_block(block, old[block], new[block], help_text=help_text, counts=counts)
            if body:
                lines.append(_heading(block, old[block], new[block]))
                lines.extend(body)
            elif old[block].get("version") != new[block].get("version"):
                lines.append(f"{_heading(block, old[block], new[block])}: no field changes")
            else:
                # A block read from another release than the rest of its package's (PPO after trl 1.12):
                # generate_contract keeps the section when the install lacks the class.
                package = new[block].get("package")
                usual = Counter(b.get("version") for b in new.values() if b.get("package") == package).most_common(1)[
                    0
                ][0]
                if new[block].get("version") != usual:
                    lines.append(
                        f"{block} ({new[block].get('source')}): no changes; kept as read from {package}"
                        f" {new[block].get('version')} (the other {package} blocks are from {usual})"
                    )
    return lines, counts


def total_line(counts: Counter[str]) -> str:
    shown = sum(
        counts[k] for k in ("added", "removed", "changed", "training_defaults", "blocks_added", "blocks_removed")
    )
    parts = [
        f"{counts[k]} {label}"
        for k, label in (
            ("added", "added"),
            ("removed", "removed"),
            ("changed", "changed"),
            ("training_defaults", "training defaults changed"),
            ("blocks_added", "blocks added"),
            ("blocks_removed", "blocks removed"),
        )
        if counts[k]
    ]
    help_only = f"; {counts['help_only']} help-text-only" if counts["help_only"] else ""
    return f"contract: {shown} changes{' (' + ', '.join(parts) + ')' if parts else ''}{help_only}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m handlers.contract.contract_diff", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("old", type=Path, help="the contract before (e.g. the checked-in schemas/trl_contract.json)")
    parser.add_argument("new", type=Path, help="the contract after (e.g. regenerated with newer TRL)")
    parser.add_argument("--help-text", action="store_true", help="also show fields whose help text alone changed")
    args = parser.parse_args(argv)
    try:
        old, new = (json.loads(path.read_text()) for path in (args.old, args.new))
    except (OSError, ValueError) as error:
        print(f"contract_diff: {error}", file=sys.stderr)
        return 2
    lines, counts = diff(old, new, help_text=args.help_text)
    for line in lines or ["no changes"]:
        print(line)
    if counts["help_only"] and not args.help_text:
        print(f"({counts['help_only']} fields changed only their help text; --help-text shows them)")
    print(total_line(counts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
