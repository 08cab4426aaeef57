"""The one rule for a local path a request names: which part of it is fixed, and whether that part,
symlinks resolved, lies inside a root the operator allows.

Both sides use it: the daemon's policy at intake (daemon/admission/policy.py), and the child for every file
a glob or a folder expands to, where the file is opened (handlers/toolkit/sources.py, handlers/toolkit/vision.py).
Containment is judged on whole path components (`/data` does not contain `/data-backup`), never on
a string prefix.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

_GLOB = re.compile(r"[*?\[]")


def has_parent_segment(location: str) -> bool:
    """Whether a location has a '..' component (by either slash): refused wherever a location is named."""
    return ".." in re.split(r"[/\\]", location)


def fixed_part(location: str) -> str:
    """The path up to (not including) its first component with a glob character: `/data*/x.jsonl`
    is fixed only as far as `/`, so its containment is judged there."""
    parts = location.split("/")
    fixed = []
    for part in parts:
        if _GLOB.search(part):
            break
        fixed.append(part)
    return "/".join(fixed) or "/"


def within(path: str | Path, roots: Iterable[Path]) -> bool:
    """Whether `path`, every symlink in it resolved, lies inside one of `roots` (also resolved)."""
    resolved = Path(path).resolve()
    return any(resolved.is_relative_to(root.resolve()) for root in roots)


def local_location_inside(location: str, roots: Iterable[Path]) -> bool:
    """Whether a local location (a file, a folder or a glob) can only name files under a root: its
    fixed part is inside one. The child checks each file it expands to again (`within`)."""
    return within(fixed_part(location), roots)
