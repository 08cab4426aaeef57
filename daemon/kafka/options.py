"""The connection options every Kafka client of adapterd shares: brokers, TLS and SASL, from the settings."""

from __future__ import annotations

from typing import Any

from aiokafka.helpers import create_ssl_context

from daemon.settings import Settings


def kafka_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments for AIOKafkaConsumer, AIOKafkaProducer and AIOKafkaAdminClient."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "security_protocol": settings.security_protocol,
    }
    if settings.security_protocol in ("SSL", "SASL_SSL"):
        options["ssl_context"] = create_ssl_context(
            cafile=str(settings.ssl_cafile) if settings.ssl_cafile else None,
            certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
            keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        )
    if settings.security_protocol.startswith("SASL_"):
        assert settings.sasl_password is not None  # Settings checks that SASL settings are complete
        options.update(
            sasl_mechanism=settings.sasl_mechanism,
            sasl_plain_username=settings.sasl_username,
            sasl_plain_password=settings.sasl_password.get_secret_value(),
        )
    return options
