from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.errors import ConfigError
from daemon.settings import Settings, load_settings
from schemas.signing import new_key_pair
from testbed.fleet_keys import fleet_keys


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("ADAPTERD_"):
            monkeypatch.delenv(name)


def test_toml_file_then_environment_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "adapterd.toml"
    config.write_text('bootstrap_servers = "kafka-1:9092,kafka-2:9092"\ngroup_id = "from-file"\njob_slots = 2\n')
    monkeypatch.setenv("ADAPTERD_GROUP_ID", "from-env")
    settings = load_settings(config)
    assert settings.bootstrap_servers == "kafka-1:9092,kafka-2:9092"
    assert settings.job_slots == 2
    assert settings.group_id == "from-env"


def test_loading_a_file_leaves_later_settings_as_they_were(tmp_path: Path) -> None:
    """load_settings(file) is read by that call only: a later Settings() in the same process (a
    test's, the demo's) does not pick up the file's values."""
    import os

    config = tmp_path / "adapterd.toml"
    config.write_text("job_slots = 2\n")
    assert load_settings(config).job_slots == 2
    assert "ADAPTERD_CONFIG" not in os.environ
    assert Settings().job_slots == Settings.model_fields["job_slots"].default


def test_hub_token_is_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTERD_HUB_TOKEN", "hf_secret")
    settings = load_settings()
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_secret"
    assert "hf_secret" not in repr(settings)


def test_bad_values_are_named(tmp_path: Path) -> None:
    config = tmp_path / "adapterd.toml"
    config.write_text('bootstrap_servers = "no-port"\njob_slots = 0\nunknown_setting = 1\n')
    with pytest.raises(ConfigError) as error:
        load_settings(config)
    message = str(error.value)
    assert "bootstrap_servers" in message and "host:port" in message
    assert "job_slots" in message
    assert "unknown_setting" in message


def test_a_misspelt_key_names_the_setting_it_is_most_likely_a_typo_of(tmp_path: Path) -> None:
    config = tmp_path / "adapterd.toml"
    config.write_text('boostrap_servers = "kafka-1:9092"\nxyzzy = 1\n[teams.ml]\nweightt = 2.0\n')
    with pytest.raises(ConfigError) as error:
        load_settings(config)
    message = str(error.value)
    assert "boostrap_servers: Extra inputs are not permitted; did you mean 'bootstrap_servers'?" in message
    # inside a table, that table's fields
    assert "teams.ml.weightt: Extra inputs are not permitted; did you mean 'weight'?" in message
    assert "xyzzy: Extra inputs are not permitted" in message  # nothing close: named, no guess
    assert message.count("did you mean") == 2


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml")


def test_hub_token_from_a_credential_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token = tmp_path / "hub-token"
    token.write_text("hf_from_file\n")
    monkeypatch.setenv("ADAPTERD_HUB_TOKEN_FILE", str(token))
    settings = load_settings()
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_from_file"


def test_unreadable_token_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ADAPTERD_HUB_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="hub_token_file"):
        load_settings()


def test_example_config_explains_every_setting_and_loads(tmp_path: Path) -> None:
    example = Path(__file__).parents[3] / "deploy" / "adapterd.example.toml"
    text = example.read_text()
    keys = {
        line.lstrip("# ").split("=")[0].strip()
        for line in text.splitlines()
        if "=" in line and not line.startswith("# ---")
    }
    assert set(Settings.model_fields) - {"hub_token", "sasl_password", "logs_token"} <= keys  # secrets come from files
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            assert "#" in line.split("=", 1)[1], f"unexplained: {line}"
    settings = load_settings(example)
    assert settings.partition_assignment == "sticky" and settings.metrics_address == "127.0.0.1:9464"


def test_secret_files_named_in_the_toml_file_and_a_given_secret_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "kafka-password").write_text("scram-from-file\n")
    (tmp_path / "hub-token").write_text("hf_from_file\n")
    config = tmp_path / "adapterd.toml"
    config.write_text(
        f'security_protocol = "SASL_SSL"\nsasl_mechanism = "SCRAM-SHA-512"\nsasl_username = "adapterd"\n'
        f'sasl_password_file = "{tmp_path / "kafka-password"}"\nhub_token_file = "{tmp_path / "hub-token"}"\n'
    )
    monkeypatch.setenv("ADAPTERD_HUB_TOKEN", "hf_from_env")
    settings = load_settings(config)
    assert settings.sasl_password is not None and settings.sasl_password.get_secret_value() == "scram-from-file"
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_from_env"


def test_an_unreadable_secret_file_names_the_setting_and_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"sasl_password_file: cannot read .*missing: No such file or directory"):
        Settings(sasl_password_file=tmp_path / "missing")


def test_hf_token_is_the_hub_token_when_the_operator_named_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daemon.settings.secret_files import token_from

    monkeypatch.delenv("HF_TOKEN", raising=False)
    assert Settings().hub_token is None and token_from(Settings()) is None  # the local sink
    monkeypatch.setenv("HF_TOKEN", "hf_from_login\n")
    settings = Settings()
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_from_login"
    assert token_from(settings) == "HF_TOKEN"
    assert Settings(hub_token=None).hub_token is None  # the demo's: the local sink, whatever the environment holds
    # A token of adapterd's own, in a file or in its variable, wins over it.
    (tmp_path / "hub-token").write_text("hf_from_file\n")
    monkeypatch.setenv("ADAPTERD_HUB_TOKEN_FILE", str(tmp_path / "hub-token"))
    settings = Settings()
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_from_file"
    assert token_from(settings) == f"hub_token_file {tmp_path / 'hub-token'}"
    monkeypatch.delenv("ADAPTERD_HUB_TOKEN_FILE")
    monkeypatch.setenv("ADAPTERD_HUB_TOKEN", "hf_from_adapterd")
    settings = Settings()
    assert settings.hub_token is not None and settings.hub_token.get_secret_value() == "hf_from_adapterd"
    assert token_from(settings) == "hub_token"


@pytest.mark.parametrize("token", ["", "x", "fifteen-bytes!!"])
def test_a_short_logs_token_is_refused_naming_the_setting(tmp_path: Path, token: str) -> None:
    with pytest.raises(ConfigError, match=r"logs_token: Value error, a token of at least 16 bytes") as error:
        load_settings(logs_token=token)
    assert "fifteen-bytes!!" not in str(error.value)  # the refusal never echoes the secret
    (tmp_path / "logs-token").write_text(token + "\n")
    with pytest.raises(ConfigError, match=r"logs_token: Value error, a token of at least 16 bytes"):
        load_settings(logs_token_file=tmp_path / "logs-token")
    assert load_settings(logs_token="sixteen-bytes-ok").logs_token is not None


def test_the_endpoints_certificate_needs_its_key_and_addresses_are_host_and_port(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="http_tls_certfile and http_tls_keyfile go together"):
        load_settings(http_tls_certfile=tmp_path / "cert.pem")
    with pytest.raises(ConfigError, match=r"advertised_address: Value error, expected host:port .*'10.0.0.5:9464/x'"):
        load_settings(advertised_address="10.0.0.5:9464/x")
    tls = load_settings(
        logs_token="sixteen-bytes-ok", http_tls_certfile=tmp_path / "c", http_tls_keyfile=tmp_path / "k"
    )
    assert (
        tls.logs_endpoint_scheme == "https"
        and load_settings(logs_token="sixteen-bytes-ok").logs_endpoint_scheme == "http"
    )
    assert load_settings().logs_endpoint_scheme is None  # no token: no endpoint


def test_priority_classes_without_event_keys_or_a_fleet_retry_key_are_refused_naming_the_settings(
    tmp_path: Path,
) -> None:
    """With classes every host, and the CLI's places, decide from the events topic, and hosts take each other's signed
    retry counts (issue 61): settings with classes and no key to verify events by are refused (any command, exit 2),
    and `adapterd run` refuses to start without the fleet's retry key (exit 2), each naming the settings."""
    keys = fleet_keys(tmp_path / "keys")
    config = tmp_path / "adapterd.toml"
    config.write_text(
        f'work_dir = "{tmp_path / "work"}"\npriority_classes = [{{name = "urgent"}}, {{name = "batch"}}]\n'
    )
    with pytest.raises(
        ConfigError, match=r"priority_classes need event_signing_key_file or event_verify_keys\(_file\)"
    ):
        load_settings(config, retry_key_file=keys["retry_key_file"])
    for command in (["run"], ["jobs"]):
        result = CliRunner().invoke(app, [*command, "--config", str(config)])
        assert result.exit_code == 2
        assert all(
            name in result.output for name in ("priority_classes", "event_signing_key_file", "event_verify_keys")
        )
    # Event keys alone: the CLI's settings (an operator's, with the public key), but no daemon.
    config.write_text(config.read_text() + f'event_verify_keys = ["{new_key_pair()[1]}"]\n')
    assert load_settings(config).priority_classes and load_settings(config, **keys).priority_classes
    result = CliRunner().invoke(app, ["run", "--config", str(config)])
    assert result.exit_code == 2 and "priority_classes need retry_key_file" in result.output
    assert not (tmp_path / "work").exists()  # refused before anything was made
    assert load_settings(work_dir=tmp_path).priority_classes == []  # without classes nothing is required
