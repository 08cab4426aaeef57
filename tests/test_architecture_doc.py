"""docs/architecture.md lists the daemon's parts in the order of its layers: in "Where things are" (a
sub-bullet a part, each opening with its path) and in the box diagram of "The packages and their
boundaries" (a line a part, two spaces in, from `daemon/` to `handlers/`). Both lists hold every part
of `DAEMON_LAYERS` (tests/test_boundaries.py, which holds the imports) once, lowest first: a part
comes after another only if its layer is not below the other's. So a part added to the tree and to
the layers but not to the page, or drawn above a part it stands on, fails here; the docs names test
(tests/test_docs_names.py) cannot see either, since the names exist.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_boundaries import DAEMON_LAYERS

PAGE = Path(__file__).parents[1] / "docs" / "architecture.md"

WHERE_PART = re.compile(r"^  - `daemon/(\w+)(?:/|\.py)`")  # "  - `daemon/store/`: ..." in "Where things are"
DIAGRAM_PART = re.compile(r"^  (\w+)(?:/|\.py) ")  # "  store/       checkpoints.py ..." in the diagram


def section(text: str, title: str) -> list[str]:
    """The lines of the `## title` section."""
    lines = text.splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def where_parts(text: str) -> list[str]:
    """The daemon's parts as "Where things are" lists them, in order."""
    return [match.group(1) for line in section(text, "Where things are") if (match := WHERE_PART.match(line))]


def diagram_parts(text: str) -> list[str]:
    """The daemon's parts as the box diagram draws them, in order: its lines from `daemon/` to `handlers/`."""
    lines = section(text, "The packages and their boundaries")
    start = next(i for i, line in enumerate(lines) if line.startswith("daemon/ "))
    end = next(i for i, line in enumerate(lines) if line.startswith("handlers/ "))
    return [match.group(1) for line in lines[start + 1 : end] if (match := DIAGRAM_PART.match(line))]


def order_problems(parts: list[str], layers: list[set[str]] = DAEMON_LAYERS) -> list[str]:
    """What is wrong with `parts` as a list of the layers' parts, lowest first: a part missing, one
    listed twice or not in any layer, and one listed after a part of a higher layer."""
    depth = {part: index for index, layer in enumerate(layers) for part in layer}
    problems = [f"{part} missing" for part in sorted(set(depth) - set(parts))]
    problems += [f"{part} listed {parts.count(part)} times" for part in sorted(set(parts)) if parts.count(part) > 1]
    problems += [f"{part} is in no layer" for part in sorted(set(parts) - set(depth))]
    highest: str | None = None
    for part in (part for part in parts if part in depth):
        if highest is not None and depth[part] < depth[highest]:
            problems.append(f"{part} (layer {depth[part]}) listed after {highest} (layer {depth[highest]})")
        if highest is None or depth[part] >= depth[highest]:
            highest = part
    return problems


@pytest.mark.parametrize("read", [where_parts, diagram_parts], ids=["where-things-are", "diagram"])
def test_the_page_lists_the_daemons_parts_in_the_order_of_its_layers(read: Callable[[str], list[str]]) -> None:
    parts = read(PAGE.read_text())
    assert len(parts) > 10  # the list was found
    problems = order_problems(parts)
    assert not problems, "docs/architecture.md: " + "; ".join(problems)


def test_the_order_check_finds_a_part_out_of_order_missing_or_twice() -> None:
    layers = [{"errors"}, {"settings"}, {"kafka", "store"}, {"job"}, {"cli"}]
    assert order_problems(["errors", "settings", "store", "kafka", "job", "cli"], layers) == []  # peers in any order
    assert order_problems(["errors", "settings", "job", "kafka", "store", "cli"], layers) == [
        "kafka (layer 2) listed after job (layer 3)",
        "store (layer 2) listed after job (layer 3)",
    ]
    assert order_problems(["errors", "settings", "kafka", "job", "cli"], layers) == ["store missing"]
    assert order_problems(["errors", "settings", "kafka", "store", "job", "cli", "jobs", "cli"], layers) == [
        "cli listed 2 times",
        "jobs is in no layer",
    ]


def test_the_readers_find_the_parts_of_a_page() -> None:
    page = "\n".join(
        [
            "## Where things are",
            "- `daemon/`: the service",
            "  - `daemon/errors.py`: the error tree",
            "  - `daemon/store/`: the store (`daemon/job/` is not a part's line)",
            "## The packages and their boundaries",
            "```",
            "daemon/    the service",
            "           prose",
            "  errors.py    the error tree",
            "  store/       checkpoints.py",
            "    admin/     a sub-folder, not a part",
            "handlers/  the child",
            "  protocol.py  not the daemon's",
            "```",
        ]
    )
    assert where_parts(page) == ["errors", "store"]
    assert diagram_parts(page) == ["errors", "store"]
