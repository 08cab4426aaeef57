"""The JSON Schema files generated from the models, for producers and consumers in other languages.

`python -m handlers.contract.jsonschema` rewrites them; a test fails when the checked-in files drift.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import TypeAdapter

from schemas.control import CONTROL_ADAPTER
from schemas.events import Event
from schemas.generated import SCHEMA_DIR
from schemas.request import TrainingRequest


def generated_schemas() -> dict[str, str]:
    """File name → file text, for every schema adapterd publishes."""
    documents = {
        "request.schema.json": TypeAdapter(TrainingRequest).json_schema(),
        "event.schema.json": TypeAdapter(Event).json_schema(),
        "control.schema.json": CONTROL_ADAPTER.json_schema(),
    }
    for name, document in documents.items():
        document["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        document["$id"] = f"https://adapterd.dev/schemas/v1/{name}"
    return {name: json.dumps(doc, indent=2, sort_keys=True) + "\n" for name, doc in documents.items()}


def write_schemas(directory: Path = SCHEMA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in generated_schemas().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written


if __name__ == "__main__":
    for path in write_schemas():
        print(path)
