"""The settings source that reads the daemon's secrets from the files the operator names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from daemon.errors import ConfigError


class SecretFilesSource(PydanticBaseSettingsSource):
    """`hub_token` and `sasl_password` from the files `hub_token_file` and `sasl_password_file` name.

    Operators hand secrets over as files (systemd's `LoadCredential=` puts them in `%d`; a container
    mounts them wherever it mounts them), and name the file in the TOML file or the environment. This
    source comes after those: pydantic-settings gives it what the sources before it found
    (`current_state`), so it reads each named file, unless the secret itself was given.
    """

    SECRETS = ("hub_token", "sasl_password")

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
