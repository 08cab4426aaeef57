"""docs/methods.md's method table, generated from the method table (`schemas.methods.METHODS`).

`python -m handlers.contract.methods_doc` rewrites the table under "## Methods" in docs/methods.md; a test
fails when the page's table differs from `markdown_table()`. Its links are relative to docs/.
"""

from __future__ import annotations

from pathlib import Path

from schemas.methods import METHODS
from schemas.request import REQUEST_MODELS

README = Path(__file__).resolve().parents[2] / "docs" / "methods.md"
HEADING = "## Methods"


def markdown_table() -> str:
    lines = [
        "| method | TRL trainer | TRL config | status | dataset columns | vision-language | example | fields |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, method in METHODS.items():
        status = method.status + (f", trl{method.trl_range} only" if method.trl_range else "")
        example = f"[{name}.json](../schemas/examples/{name}.json)"
        block = REQUEST_MODELS[name].model_fields[name].annotation
        fields = f"[`{name}`: {len(block.model_fields)}](requests.md#{name})"  # type: ignore[union-attr]
        vision = (
            f"yes: + `images` or `image` ([{name}-vision.json](../schemas/examples/{name}-vision.json))"
            if method.vision
            else "no"
        )
        lines.append(
            f"| `{name}` | `{method.trainer}` | `{method.config}` | {status} | {method.columns} | "
            f"{vision} | {example} | {fields} |"
        )
    return "\n".join(lines) + "\n"


def table_span(text: str) -> tuple[int, int]:
    """Where the page's method table is: the first block of `|` lines after the Methods heading."""
    lines = text.splitlines(keepends=True)
    heading = next(i for i, line in enumerate(lines) if line.rstrip() == HEADING)
    start = next(i for i in range(heading, len(lines)) if lines[i].startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    offset = sum(len(line) for line in lines[:start])
    return offset, offset + sum(len(line) for line in lines[start:end])


def readme_table(readme: Path = README) -> str:
    text = readme.read_text()
    start, end = table_span(text)
    return text[start:end]


def write_readme(readme: Path = README) -> None:
    text = readme.read_text()
    start, end = table_span(text)
    readme.write_text(text[:start] + markdown_table() + text[end:])


if __name__ == "__main__":
    write_readme()
    print(README)
