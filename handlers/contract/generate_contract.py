"""Regenerate the request's TRL blocks from the installed TRL, transformers and PEFT:
schemas/trl_contract.json (what was read), schemas/trl_fields.py (the pydantic models) and
docs/requests.md (the reference), then the JSON Schemas.

    uv run python -m handlers.contract.generate_contract                 # every block this TRL has
    uv run --project tests/trl_1_12 python -m handlers.contract.generate_contract ppo   # PPO, from trl 1.12

A block this install lacks (PPO after trl 1.12) keeps its checked-in section. A field that was in the
checked-in contract and is gone from TRL is named: add it to RENAMED in schemas/contract_rules.py
(old name → new) so requests that set it keep working until schema version 2.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from handlers.contract.contract_render import DOC_FILE, MODULE_FILE, render_doc, render_module
from handlers.contract.contract_source import read_contract
from schemas.contract_rules import BLOCK_SOURCES, RENAMED
from schemas.generated import CONTRACT_FILE, load_contract


def removed_fields(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Fields the checked-in contract had that TRL no longer has, and that RENAMED does not carry."""
    return [
        f"{block}.{name}"
        for block in new
        if block in old
        for name in old[block]["fields"]
        if name not in new[block]["fields"] and name not in RENAMED.get(block, {})
    ]


def write(contract: dict[str, Any]) -> list[Path]:
    CONTRACT_FILE.write_text(json.dumps(contract, indent=1) + "\n")  # in the dataclasses' order, as TRL groups them
    MODULE_FILE.write_text(render_module(contract))
    DOC_FILE.write_text(render_doc(contract))
    return [CONTRACT_FILE, MODULE_FILE, DOC_FILE]


def main(blocks: list[str]) -> int:
    old = load_contract() if CONTRACT_FILE.exists() else {}
    fresh = read_contract(blocks or BLOCK_SOURCES)
    contract = {block: fresh.get(block, old.get(block)) for block in BLOCK_SOURCES if block in fresh or block in old}
    for name in removed_fields(old, fresh):
        print(f"removed from TRL: {name}: add it to RENAMED in schemas/contract_rules.py (old → new)", file=sys.stderr)
    for path in write(contract):
        print(path)
    # The JSON Schemas in a fresh interpreter: this one may hold the request models of the old trl_fields.py.
    return subprocess.run([sys.executable, "-m", "handlers.contract.jsonschema"], check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
