"""docs/events.md stays true: each JSON example is a valid event, and every event type has one."""

import json
import re
from pathlib import Path

from schemas import parse_event
from schemas.events import EVENT_ADAPTER

DOC = Path(__file__).parents[2] / "docs" / "events.md"


def test_every_example_parses_and_every_type_has_one() -> None:
    examples = re.findall(r"```json\n(.*?)\n```", DOC.read_text(), re.DOTALL)
    types = {parse_event(example.encode()).type for example in examples}
    schema = EVENT_ADAPTER.json_schema()
    all_types = {
        definition["properties"]["type"]["const"]
        for definition in schema["$defs"].values()
        if "type" in definition.get("properties", {})
    }
    assert all_types == types
    for example in examples:
        assert json.loads(example)["schema_version"] == 1
