"""The settings sources of the daemon's secrets: the files the operator names, and $HF_TOKEN; and the
keys of signed events (schemas/signing.py), read from the files and values the settings name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from daemon.errors import ConfigError
from schemas.signing import EventKeys, EventSigner


class SecretFilesSource(PydanticBaseSettingsSource):
    """`hub_token`, `sasl_password` and `logs_token` from the files their `*_file` settings name.

    Operators hand secrets over as files (systemd's `LoadCredential=` puts them in `%d`; a container
    mounts them wherever it mounts them), and name the file in the TOML file or the environment. This
    source comes after those: pydantic-settings gives it what the sources before it found
    (`current_state`), so it reads each named file, unless the secret itself was given.
    """

    SECRETS = ("hub_token", "sasl_password", "logs_token")

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # not used: __call__ reads the files as a whole

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for secret in self.SECRETS:
            path = self.current_state.get(f"{secret}_file")
            if not path or self.current_state.get(secret) is not None:
                continue
            try:
                found[secret] = Path(path).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"invalid settings: {secret}_file: cannot read {path}: {exc.strerror}") from exc
        return found


class HfTokenSource(PydanticBaseSettingsSource):
    """`hub_token` from $HF_TOKEN, huggingface_hub's own variable (what someone who ran
    `hf auth login` or exported a token expects the tools to use), when the operator named no token
    of adapterd's (neither `hub_token` nor `hub_token_file`): before, such a daemon gave its jobs no
    token and put every artifact in the local sink without a word. The start-up line
    `daemon.started` says the sink and where its token came from (`token_from`)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # not used: __call__ reads the variable

    def __call__(self) -> dict[str, Any]:
        token = os.environ.get("HF_TOKEN", "").strip()
        # A `hub_token` given at all, even as None (the demo's Settings(hub_token=None): the local sink), is the
        # caller's word on it.
        if token and "hub_token" not in self.current_state and not self.current_state.get("hub_token_file"):
            return {"hub_token": token}
        return {}


def token_from(settings: Any) -> str | None:
    """Where the daemon's Hub token came from, for the start-up log; None without one (the local sink)."""
    if settings.hub_token is None:
        return None
    if settings.hub_token_file is not None:
        return f"hub_token_file {settings.hub_token_file}"
    if (
        "ADAPTERD_HUB_TOKEN" not in os.environ
        and os.environ.get("HF_TOKEN", "").strip() == settings.hub_token.get_secret_value()
    ):
        return "HF_TOKEN"
    return "hub_token"


def event_signer(settings: Any) -> EventSigner | None:
    """The signer of this host's events, from `event_signing_key_file`; None without one."""
    path = settings.event_signing_key_file
    if path is None:
        return None
    try:
        return EventSigner.from_file(Path(path))
    except OSError as exc:
        raise ValueError(f"event_signing_key_file: cannot read {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise ValueError(f"event_signing_key_file: {path}: {exc}") from exc


def _public_keys(texts: list[str], path: Any, setting: str) -> EventKeys:
    """Keys given inline (the setting `setting`) and in the file of `<setting>_file`; a ValueError names which."""
    try:
        keys = EventKeys.parse(texts)
    except ValueError as exc:
        raise ValueError(f"{setting}: {exc}") from exc
    if path is not None:
        try:
            keys.by_id.update(EventKeys.from_file(Path(path)).by_id)
        except OSError as exc:
            raise ValueError(f"{setting}_file: cannot read {path}: {exc.strerror}") from exc
        except ValueError as exc:
            raise ValueError(f"{setting}_file: {path}: {exc}") from exc
    return keys


def event_keys(settings: Any) -> EventKeys | None:
    """The public keys whose signatures this host trusts on events: `event_verify_keys`, those in
    `event_verify_keys_file`, and the public key of its own signing key, so a host that signs never
    takes an unsigned event. None when there is none: events are then read unverified."""
    keys = _public_keys(settings.event_verify_keys, settings.event_verify_keys_file, "event_verify_keys")
    signer = event_signer(settings)
    if signer is not None:
        keys.by_id[signer.key_id] = signer.public
    return keys if len(keys) else None


def team_keys(name: str, team: Any) -> EventKeys:
    """A team's producer keys (daemon/admission/grants.py), from `teams.<name>.producer_keys` and `producer_keys_file`;
    a ValueError names the setting."""
    return _public_keys(team.producer_keys, team.producer_keys_file, f"teams.{name}.producer_keys")
