"""A single-node Apache Kafka broker (KRaft) on loopback, for `adapterd demo` and the test suite.

The broker's jars come from Maven Central through the `pom.xml` beside this file and are cached
once per machine; the broker itself runs on the JVM as a child process in its own process group.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from daemon.errors import ConfigError

POM = Path(__file__).with_name("pom.xml")
READY_LINE = "Kafka Server started"


def default_jar_dir() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    digest = hashlib.sha256(POM.read_bytes()).hexdigest()[:12]
    return Path(os.environ.get("ADAPTERD_KAFKA_JARS", cache / "adapterd" / f"kafka-jars-{digest}"))


def ensure_jars(jar_dir: Path | None = None) -> Path:
    """Resolve the broker's jars with Maven into `jar_dir` unless a complete copy is there."""
    jar_dir = jar_dir or default_jar_dir()
    marker = jar_dir / ".complete"
    if marker.exists():
        return jar_dir
    mvn = shutil.which("mvn")
    if mvn is None:
        raise ConfigError("Maven ('mvn') is needed to fetch the Kafka broker's jars and is not on PATH")
    partial = jar_dir.with_name(jar_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # Maven's own output (with its terminal colours) is shown only when it fails.
    result = subprocess.run(
        [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(POM), "dependency:copy-dependencies",
         f"-DoutputDirectory={partial}", "-DincludeScope=runtime"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
    )
    if result.returncode != 0:
        raise RuntimeError(f"Maven could not fetch the Kafka broker's jars (exit {result.returncode}):\n{result.stdout[-4000:]}")
    shutil.rmtree(jar_dir, ignore_errors=True)
    partial.rename(jar_dir)
    marker.touch()
    return jar_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LocalKafka:
    """One broker process. `start()` returns once the broker logs that it has started."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    # A second listener that needs SASL/SCRAM-SHA-256 as this user, so clients' security settings can be tried.
    sasl_port: int = field(default_factory=free_port)
    scram_user: str = "adapterd"
    scram_password: str = "adapterd-secret"
    heap: str = "512m"
    properties: dict[str, str] = field(default_factory=dict)  # more broker settings (a test's authorizer), over the ones below
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def _write_properties(self) -> Path:
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port},"
                         f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}",
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "sasl.enabled.mechanisms": "SCRAM-SHA-256",
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required;",
            "log.dirs": str(self.data_dir / "logs"),
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "min.insync.replicas": "1",
            "num.partitions": "1",
            # A single test broker has no reason to wait for more members before the first rebalance.
            "group.initial.rebalance.delay.ms": "0",
            **self.properties,
        }
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def _java(self, jar_dir: Path, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise ConfigError("Java ('java', 17 or newer) is needed to run the Kafka broker and is not on PATH")
        return [java, f"-Xmx{self.heap}", "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
                "-cp", str(jar_dir / "*"), *args]

    def start(self, timeout_s: float = 90.0) -> LocalKafka:
        jar_dir = ensure_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = self._write_properties()
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id = uuid.uuid4().bytes.hex()[:22]
            subprocess.run(
                self._java(
                    jar_dir, "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(properties),
                    "--add-scram", f"SCRAM-SHA-256=[name={self.scram_user},password={self.scram_password}]",
                ),
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        log = self.log_path.open("wb")  # a fresh log: readiness is read from it
        self.process = subprocess.Popen(
            self._java(jar_dir, "kafka.Kafka", str(properties)),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka broker exited with {self.process.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"Kafka broker not started after {timeout_s}s; see {self.log_path}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
