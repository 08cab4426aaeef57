"""The Kafka broker's jars: a fixed list of Maven Central URLs with their sha256 (`jars.txt`, generated
from `pom.xml` by `python -m daemon.local_broker.generate_jars`), fetched once per machine into the
cache, each checked against its hash. No Maven is needed to fetch a list that is already resolved.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import structlog

JARS = Path(__file__).with_name("jars.txt")
MAVEN_CENTRAL = "https://repo.maven.apache.org/maven2/"
# A few downloads at once: 45 small files, most of the time is each request's round trip.
PARALLEL = 4
TIMEOUT_S = 60.0

log = structlog.get_logger()


@dataclass(frozen=True)
class Jar:
    url: str
    sha256: str

    @property
    def name(self) -> str:
        return self.url.rsplit("/", 1)[-1]


def jar_list(path: Path = JARS) -> list[Jar]:
    """The jars `path` lists, one `sha256 url` a line (`#` starts a comment)."""
    jars = []
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            sha256, url = line.split()
            jars.append(Jar(url, sha256))
    return jars


def cache_root() -> Path:
    """adapterd's folder in the user's cache (XDG_CACHE_HOME, else ~/.cache)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "adapterd"


def default_jar_dir() -> Path:
    """One folder per jar list, so that a changed list is fetched again beside the old one."""
    digest = hashlib.sha256(JARS.read_bytes()).hexdigest()[:12]
    return Path(os.environ.get("ADAPTERD_KAFKA_JARS") or cache_root() / f"kafka-jars-{digest}")


def _fetch(jar: Jar, folder: Path) -> None:
    digest = hashlib.sha256()
    target = folder / jar.name
    try:
        with urllib.request.urlopen(jar.url, timeout=TIMEOUT_S) as answer, target.open("wb") as out:
            while chunk := answer.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
    except OSError as exc:
        raise RuntimeError(f"could not fetch the Kafka broker's jar {jar.url}: {exc}") from exc
    if digest.hexdigest() != jar.sha256:
        target.unlink()
        raise RuntimeError(
            f"the Kafka broker's jar {jar.url} is not the one listed: sha256 "
            f"{digest.hexdigest()}, expected {jar.sha256}"
        )


def ensure_jars(jar_dir: Path | None = None, jars: list[Jar] | None = None) -> Path:
    """Fetch the listed jars into `jar_dir`, each checked against its sha256, unless a complete copy is there.

    The jars land in a `.partial` folder first, renamed once every one is verified: a fetch that fails
    or is cut short leaves no folder a broker would start from."""
    jar_dir = jar_dir or default_jar_dir()
    marker = jar_dir / ".complete"
    if marker.exists():
        return jar_dir
    jars = jar_list() if jars is None else jars
    partial = jar_dir.with_name(jar_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    try:
        with ThreadPoolExecutor(PARALLEL) as pool:
            list(pool.map(lambda jar: _fetch(jar, partial), jars))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(jar_dir, ignore_errors=True)
    partial.rename(jar_dir)
    marker.touch()
    log.info("local_broker_jars_fetched", jars=len(jars), folder=str(jar_dir))
    return jar_dir
