"""The daemon and the CLI connect over SASL/SCRAM with the password from a credential file, and a
wrong password stops the daemon with a clear message."""

import subprocess
import sys
from pathlib import Path

import pytest

from daemon.kafka.admin.topics import ensure_topics
from daemon.local_broker import LocalKafka
from daemon.settings import Settings
from schemas import Rejected
from testbed.client import submit, terminal_events
from testbed.processes import DaemonProcess, NotifySocket, settings_environment
from tests.helpers import sft_request


def scram_settings(settings: Settings, broker: LocalKafka, password_file: Path) -> Settings:
    return Settings(
        **{
            **settings.model_dump(exclude={"hub_token", "sasl_password"}),
            "hub_token": settings.hub_token,
            "bootstrap_servers": broker.sasl_bootstrap_servers,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_username": broker.scram_user,
            "sasl_password_file": password_file,
            "warm_child": False,
        }
    )


def test_sasl_settings_must_be_complete() -> None:
    with pytest.raises(
        ValueError, match="security_protocol SASL_SSL needs sasl_mechanism, sasl_username, sasl_password"
    ):
        Settings(security_protocol="SASL_SSL")


async def test_daemon_and_cli_over_sasl_scram(
    local_broker: LocalKafka | None, settings: Settings, tmp_path: Path
) -> None:
    if local_broker is None:
        pytest.skip("an external cluster's SASL users are unknown here")
    password_file = tmp_path / "kafka-password"
    password_file.write_text(local_broker.scram_password + "\n")
    secured = scram_settings(settings, local_broker, password_file)
    await ensure_topics(secured)

    notify = NotifySocket(tmp_path / "notify.sock")
    daemon = DaemonProcess(secured, tmp_path / "daemon.log", extra_env=notify.environment()).start()
    try:
        await notify.wait_for("READY=1", timeout_s=60)
        await submit(secured, sft_request("over-scram", output={"repo_id": "bad namespace/x"}))
        [rejected] = (await terminal_events(secured, {"over-scram"}))["over-scram"]
        assert isinstance(rejected, Rejected) and rejected.errors[0].path == "output.repo_id"
    finally:
        assert daemon.stop() == 0
        notify.close()

    password_file.write_text("not-the-password\n")
    refused = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "run"],
        env=settings_environment(secured),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode == 1
    assert f"adapterd: Kafka at {local_broker.sasl_bootstrap_servers}" in refused.stderr
