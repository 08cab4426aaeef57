"""The settings of how this host reaches Kafka, a mixin of `daemon.settings.Settings` (its
`ADAPTERD_*` variables and TOML keys are those of every other setting, and its fields come first):
the brokers, the topics, the consumer group and its membership, and the connection's security."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Self

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator


class KafkaSettings(BaseModel):
    """The brokers, topics, group and security; a SASL protocol without its mechanism, user and
    password, or a server that is not host:port, is refused naming the setting."""

    bootstrap_servers: str = "127.0.0.1:9092"
    requests_topic: str = "adapterd.requests"
    events_topic: str = "adapterd.events"
    dlq_topic: str = "adapterd.dlq"
    control_topic: str = "adapterd.control"
    state_topic: str = Field(
        "adapterd.state",
        description=(
            "The table of requests: a compacted topic keyed by request id whose value is the request's state as its "
            "latest event says it (daemon/table/), kept by the daemons from the events topic; `adapterd jobs` and "
            "`get` and the fleet's view read it. Derived: the events topic stays the record."
        ),
    )
    state_retention_s: float = Field(
        7 * 86_400.0,
        ge=60,
        le=10 * 365 * 86_400.0,
        description=(
            "How long a request stays in the table of requests after its terminal event; then its keeper writes its "
            "tombstone and compaction removes it (its events stay in the events topic for that topic's retention)."
        ),
    )
    claims_topic: str = Field(
        "adapterd.claims",
        description=(
            "With priority_classes: the topic a host moves each request it takes into, one job per partition (at least "
            "as many partitions as the fleet has slots); the requests topics are then the classes' queues."
        ),
    )
    topic_partitions: int | None = Field(
        None,
        ge=1,
        le=100_000,
        description=(
            "The partitions each topic should have: `adapterd topics` makes them (its --partitions default) and "
            "`adapterd doctor` fails a topic with fewer. The requests, class and claims topics need at least as many "
            "as the fleet has slots; unset: not checked."
        ),
    )
    group_id: str = "adapterd"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = Field(None, description="Prefer sasl_password_file (systemd: LoadCredential=).")
    sasl_password_file: Path | None = Field(
        None, description="A file holding the SASL password (systemd: %d/kafka-password)."
    )
    ssl_cafile: Path | None = Field(
        None, description="CA bundle that signed the brokers' certificates (SSL, SASL_SSL)."
    )
    ssl_certfile: Path | None = Field(
        None, description="Client certificate, for brokers that require one (mutual TLS)."
    )
    ssl_keyfile: Path | None = None
    max_poll_interval_ms: int = Field(300_000, ge=1_000)
    session_timeout_ms: int = Field(45_000, ge=1_000)

    control_lookback_s: float = Field(
        86_400, ge=0, description="At start, cancels this recent are read from the control topic."
    )
    group_instance_id: str | None = Field(
        None, description="Static group membership: a restart within session_timeout_ms causes no rebalance."
    )
    partition_assignment: Literal["range", "roundrobin", "sticky"] = "sticky"

    @model_validator(mode="after")
    def _sasl_complete(self) -> Self:
        if self.security_protocol.startswith("SASL_"):
            sasl = {
                "sasl_mechanism": self.sasl_mechanism,
                "sasl_username": self.sasl_username,
                "sasl_password": self.sasl_password,
            }
            missing = [name for name, value in sasl.items() if value is None]
            if missing:
                raise ValueError(f"security_protocol {self.security_protocol} needs {', '.join(missing)}")
        return self

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        for server in value.split(","):
            host, _, port = server.strip().rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"expected host:port[,host:port...], got {server!r}")
        return value
