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


def test_every_example_carries_every_field_its_type_has_in_the_order_the_daemon_writes_them() -> None:
    """An example is what a consumer reads from the topic: an event parsed and written back (as the daemon writes it,
    every field, null ones too) is the example itself, so no field real events carry is missing from the doc."""
    for example in re.findall(r"```json\n(.*?)\n```", DOC.read_text(), re.DOTALL):
        written = parse_event(example.encode()).model_dump_json()
        assert list(json.loads(example).items()) == list(json.loads(written).items()), example[:300]
