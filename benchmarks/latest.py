"""benchmarks/results/latest.md: each benchmark's latest table, one section each.

`python -m benchmarks --only start` rewrites the `start` section and leaves the others as their own
last runs left them, each under the header of the run that made it (date, host, cores), so the
file always holds every benchmark's latest figures. latest.json holds the last run's rows only
(what `benchmarks.compare` reads back).
"""

from __future__ import annotations

import re

# The sections, in the file's order: the names `--only` takes.
ORDER = ("intake", "footprint", "start", "queue", "overhead")
TITLE = "# adapterd benchmarks: each one's latest run\n"
_HEADING = re.compile(r"^## (\S+)\n", re.MULTILINE)


def sections(text: str) -> dict[str, str]:
    """The sections of a latest.md, by name (a file without sections, from before them, has none)."""
    found = list(_HEADING.finditer(text))
    return {
        match.group(1): text[match.end() : found[index + 1].start() if index + 1 < len(found) else len(text)].strip(
            "\n"
        )
        + "\n"
        for index, match in enumerate(found)
    }


def updated(text: str, new: dict[str, str]) -> str:
    """latest.md with the sections in `new` replaced (or added) and every other one kept."""
    kept = {**sections(text), **new}
    names = [name for name in ORDER if name in kept] + sorted(name for name in kept if name not in ORDER)
    return TITLE + "".join(f"\n## {name}\n\n{kept[name].strip(chr(10))}\n" for name in names)
