"""A single-node Apache Kafka broker (KRaft) on loopback, for `adapterd demo` and the test suite.

The broker's jars come from Maven Central, as `jars.txt` lists them (resolved from the `pom.xml` beside
it), and are cached once per machine; the broker runs on the project's own Java runtime (`java.py`)
as a child process in its own process group, and says where it runs while it does (`running.py`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from daemon.local_broker.jars import default_jar_dir, ensure_jars
from daemon.local_broker.java import Java, find_java
from daemon.local_broker.running import forget, record

__all__ = ["LocalKafka", "default_jar_dir", "ensure_jars", "free_port"]

READY_LINE = "Kafka Server started"


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
    properties: dict[str, str] = field(
        default_factory=dict
    )  # more broker settings (a test's authorizer), over the ones below
    process: subprocess.Popen[bytes] | None = None
    java: Java = field(default_factory=find_java)

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
            "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            ),
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
        return [
            str(self.java.path),
            f"-Xmx{self.heap}",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-cp",
            str(jar_dir / "*"),
            *args,
        ]

    def start(self, timeout_s: float = 90.0) -> LocalKafka:
        jar_dir = ensure_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        properties = self._write_properties()
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id = uuid.uuid4().bytes.hex()[:22]
            formatted = subprocess.run(
                self._java(
                    jar_dir,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(properties),
                    "--add-scram",
                    f"SCRAM-SHA-256=[name={self.scram_user},password={self.scram_password}]",
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
            if (
                formatted.returncode != 0
            ):  # say why: its output is the only account of it (seen once in CI, unexplained)
                tail = formatted.stdout.decode(errors="replace")[-2000:]
                raise RuntimeError(
                    f"Kafka's storage format exited with {formatted.returncode} for {self.data_dir}: {tail}"
                )
        log = self.log_path.open("wb")  # a fresh log: readiness is read from it
        self.process = subprocess.Popen(
            self._java(jar_dir, "kafka.Kafka", str(properties)),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while READY_LINE not in self.log_path.read_text(errors="replace"):
            if self.process.poll() is not None:
                raise RuntimeError(f"Kafka broker exited with {self.process.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"Kafka broker not started after {timeout_s}s; see {self.log_path}")
            time.sleep(0.2)
        record(self.port, self.java, jar_dir, self.process.pid)
        return self

    def stop(self) -> None:
        forget(self.port)
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
