"""The generated files schemas/ ships, as run time reads them, without their generators
(handlers/contract/ writes them; tests fail when they drift):

- schemas/trl_contract.json: the contract read from TRL, transformers and PEFT (`load_contract`,
  which `adapterd convert` reads);
- schemas/json/: the JSON Schemas of requests, events and control messages (`json_schemas`,
  which `adapterd schema` prints).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONTRACT_FILE = Path(__file__).with_name("trl_contract.json")
SCHEMA_DIR = Path(__file__).with_name("json")
SCHEMA_FILES = ("request.schema.json", "event.schema.json", "control.schema.json")


def load_contract(path: Path = CONTRACT_FILE) -> dict[str, Any]:
    return json.loads(path.read_text())


def json_schemas(directory: Path = SCHEMA_DIR) -> dict[str, Any]:
    """File name → schema, for every schema adapterd publishes."""
    return {name: json.loads((directory / name).read_text()) for name in SCHEMA_FILES}
