"""The settings of this host's endpoint (/metrics, /healthz, /status and each job's log), a mixin of
`daemon.settings.Settings` (its `ADAPTERD_*` variables and TOML keys are those of every other setting,
and its fields follow the Kafka and job ones, as they always have): where it listens and is reached,
its TLS, the logs token, and the keys that sign and verify events. The keys are read by `Settings`
(`_event_keys`), each problem named by its setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator

from schemas.addresses import split_host_port

MIN_LOGS_TOKEN_BYTES = 16


class EndpointSettings(BaseModel):
    """The endpoint; an address that is no host:port, a certificate without its key, or a short logs
    token is refused naming the setting."""

    # The endpoint
    metrics_address: str | None = Field(
        "127.0.0.1:9464", description="host:port of /metrics, /healthz and /status; empty to switch off."
    )
    logs_token: SecretStr | None = Field(
        None,
        description=(
            "A secret shared by the fleet's operators (16 bytes or more): with one, this host's endpoint serves each "
            "job's log at /jobs/ID/log to whoever sends it (adapterd logs), and its `started` events say where; "
            "without one, it serves no log."
        ),
    )
    logs_token_file: Path | None = Field(
        None, description="A file holding logs_token (systemd: %d/logs-token from LoadCredential=)."
    )
    # Signed events (docs/guarantees.md): the fleet signs what it publishes; readers take only what it signed.
    event_signing_key_file: Path | None = Field(
        None,
        description=(
            "The fleet's Ed25519 private key (PEM, or its 32 raw bytes; systemd: %d/event-signing-key from "
            "LoadCredential=), which signs every event this host publishes; `adapterd keys` makes one. Unset: its "
            "events go out unsigned, and readers that verify ignore them."
        ),
    )
    event_verify_keys: list[str] = Field(
        default_factory=list,
        description=(
            "Public keys (base64 of 32 bytes, as `adapterd keys` prints) whose signatures the commands that read "
            "events trust. With any here, in event_verify_keys_file, or a signing key (its public key counts), an "
            "unsigned or wrongly signed event is ignored and counted; with none, events are read unverified."
        ),
    )
    event_verify_keys_file: Path | None = Field(
        None,
        description="A file of such keys, one a line (# comments), e.g. the old and the new one while keys rotate.",
    )
    producer_key_file: Path | None = Field(
        None,
        description=(
            "A team's Ed25519 private key (`adapterd keys --team`), with which `adapterd submit` signs each request it "
            "sends (adapterd-producer-signature), as a fleet with bound teams requires; the daemon does not read it."
        ),
    )
    advertised_address: str | None = Field(
        None,
        description=(
            "host:port at which other machines reach this host's endpoint, said in `started` events for adapterd "
            "logs; metrics_address when unset."
        ),
    )
    http_tls_certfile: Path | None = Field(
        None,
        description=(
            "A certificate (PEM, its chain after it) for the endpoint at metrics_address: with it and http_tls_keyfile "
            "the endpoint serves HTTPS only, and `started` events say so (endpoint_scheme)."
        ),
    )
    http_tls_keyfile: Path | None = Field(
        None, description="The private key of http_tls_certfile (systemd: %d/http-key from LoadCredential=)."
    )
    http_cafile: Path | None = Field(
        None,
        description=(
            "CA bundle that signed the fleet's endpoint certificates: with it, `adapterd logs` sends the "
            "logs token over verified TLS only."
        ),
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> EndpointSettings:
        if (self.http_tls_certfile is None) != (self.http_tls_keyfile is None):
            raise ValueError(
                "http_tls_certfile and http_tls_keyfile go together: the endpoint's certificate and its key"
            )
        return self

    @field_validator("logs_token")
    @classmethod
    def _long_token(cls, value: SecretStr | None) -> SecretStr | None:
        # Like the retry key: a short secret guarding every job's log could be guessed.
        if value is not None and len(value.get_secret_value().encode()) < MIN_LOGS_TOKEN_BYTES:
            raise ValueError(
                f"a token of at least {MIN_LOGS_TOKEN_BYTES} bytes (this one has "
                f"{len(value.get_secret_value().encode())}): make one with `openssl rand -hex 32`"
            )
        return value

    @property
    def logs_endpoint(self) -> str | None:
        """Where other machines read this host's job logs (`adapterd logs`), or None when it serves none."""
        if self.logs_token is None or self.metrics_address is None:
            return None
        return self.advertised_address or self.metrics_address

    @property
    def logs_endpoint_scheme(self) -> Literal["http", "https"] | None:
        """How `logs_endpoint` is reached, for `started` events."""
        if self.logs_endpoint is None:
            return None
        return "https" if self.http_tls_certfile is not None else "http"

    @field_validator("metrics_address", "advertised_address")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if not value:
            return None
        split_host_port(value)  # the events' own rule: an address a `started` event can carry
        return value
