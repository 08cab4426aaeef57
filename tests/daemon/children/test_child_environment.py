"""Issue 46: a job's child gets only what its job needs of the daemon's environment (an allowlist,
daemon/children/environment.py), never the daemon's other credentials: not its settings (the logs
token), not an object store's credentials when no dataset may come from that store, not any other
variable. In process through `child_environment`, and through a running daemon: the job's child
lists the names it got in its log, and the fork server's /proc/PID/environ (what every forked
child inherits) holds none of the values."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError

from daemon.children.environment import passed_on
from daemon.children.warm import child_environment
from daemon.settings import Settings
from schemas import Succeeded
from testbed.client import submit, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.helpers import sft_request

DAEMON_ENV = {
    "PATH": "/usr/bin",
    "HOME": "/var/lib/adapterd",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONPATH": "/opt/x",
    "HF_HOME": "/var/cache/hf",
    "HF_HUB_DISABLE_XET": "1",
    "CUDA_VISIBLE_DEVICES": "0",
    "NCCL_DEBUG": "WARN",
    "TORCHINDUCTOR_CACHE_DIR": "/tmp/ind",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    "HTTPS_PROXY": "http://proxy:3128",
    "SOME_SECRET": "s3cr3t",
    "DATABASE_URL": "postgres://u:p@db/x",
    "GITHUB_TOKEN": "ghp_x",
    "HUGGING_FACE_HUB_TOKEN": "hf_other",
    "ADAPTERD_LOGS_TOKEN": "the-fleets-logs-token",
    "ADAPTERD_SASL_PASSWORD": "kafka",
    "NOTIFY_SOCKET": "/run/systemd/notify",
    "CREDENTIALS_DIRECTORY": "/run/credentials/adapterd.service",
    "AWS_ACCESS_KEY_ID": "AKIA",
    "AWS_SECRET_ACCESS_KEY": "aws-secret",
    "FSSPEC_S3_KEY": "k",
    "AZURE_STORAGE_CONNECTION_STRING": "az",
    "IDENTITY_ENDPOINT": "http://169.254.169.254",
    "GOOGLE_APPLICATION_CREDENTIALS": "/etc/gcp.json",
    "MLFLOW_TRACKING_TOKEN": "mlflow-token",
}
BASICS = {
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "PYTHONPATH",
    "HF_HOME",
    "HF_HUB_DISABLE_XET",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_DEBUG",
    "TORCHINDUCTOR_CACHE_DIR",
    "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT",
    "HTTPS_PROXY",
}


def test_a_child_gets_the_basics_and_none_of_the_daemons_other_variables() -> None:
    assert set(passed_on(DAEMON_ENV, Settings())) == BASICS


def test_an_object_stores_credentials_go_only_where_a_dataset_may_come_from_it() -> None:
    s3 = Settings(allowed_dataset_urls=["s3://ml-data/curated/*"])
    assert set(passed_on(DAEMON_ENV, s3)) == BASICS | {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "FSSPEC_S3_KEY"}
    azure = Settings(allowed_dataset_urls=["abfs://c/curated/*"])
    assert set(passed_on(DAEMON_ENV, azure)) == BASICS | {"AZURE_STORAGE_CONNECTION_STRING", "IDENTITY_ENDPOINT"}
    gcs = Settings(allowed_dataset_urls=["gs://ml-data/*"], mlflow_tracking_uri="http://127.0.0.1:5000")
    assert set(passed_on(DAEMON_ENV, gcs)) == BASICS | {"GOOGLE_APPLICATION_CREDENTIALS", "MLFLOW_TRACKING_TOKEN"}


def test_the_operator_lists_more_by_name_or_prefix_and_never_the_daemons_own() -> None:
    listed = Settings(child_env=["DATABASE_URL", "GITHUB_*"])
    assert set(passed_on(DAEMON_ENV, listed)) == BASICS | {"DATABASE_URL", "GITHUB_TOKEN"}
    for wrong, said in (
        ("ADAPTERD_LOGS_TOKEN", "never go to a job's child"),
        ("ADAPTERD_*", "never go"),
        ("A B", "a variable's name"),
    ):
        with pytest.raises(ValidationError, match="child_env") as raised:
            Settings(child_env=[wrong])
        assert said in str(raised.value)


def test_child_environment_sets_the_hub_and_keeps_the_allowlist(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in DAEMON_ENV.items():
        monkeypatch.setenv(name, value)
    env = child_environment(Settings(hub_endpoint="http://127.0.0.1:1", hub_token=SecretStr("hf_daemons")))  # type: ignore[arg-type]
    assert env["HF_TOKEN"] == "hf_daemons" and env["HF_ENDPOINT"] == "http://127.0.0.1:1"
    assert not {
        "SOME_SECRET",
        "ADAPTERD_LOGS_TOKEN",
        "AWS_SECRET_ACCESS_KEY",
        "HUGGING_FACE_HUB_TOKEN",
        "NOTIFY_SOCKET",
    } & set(env)


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_a_jobs_child_in_a_running_daemon_gets_none_of_its_secrets(
    published: HubServer, settings: Settings, tmp_path: Path
) -> None:
    secrets = {"SOME_SECRET": "some-secret-value-46", "AWS_SECRET_ACCESS_KEY": "aws-secret-value-46"}
    logs_token = "logs-token-value-46-" + "x" * 24
    settings = settings.model_copy(update={"logs_token": SecretStr(logs_token), "child_env": ["FOR_JOBS"]})
    daemon = DaemonProcess(settings, tmp_path / "daemon.log", extra_env={**secrets, "FOR_JOBS": "listed"}).start()
    try:
        await submit(settings, sft_request("env-probe"))
        events = await terminal_events(settings, {"env-probe"}, timeout_s=500)
        assert isinstance(events["env-probe"][-1], Succeeded), events
        [server_pid] = [line["pid"] for line in daemon.log_lines() if line.get("event") == "forkserver.ready"]
        server_environ = Path(f"/proc/{server_pid}/environ").read_bytes()  # what each forked child starts with
    finally:
        daemon.stop()

    [listed] = [
        line
        for line in (settings.jobs_dir / "env-probe" / "child.log").read_text().splitlines()
        if ": environment " in line
    ]
    names = set(listed.split(": environment ", 1)[1].split())
    assert not {"SOME_SECRET", "AWS_SECRET_ACCESS_KEY", "ADAPTERD_LOGS_TOKEN"} & names, sorted(names)
    assert not {name for name in names if name.startswith("ADAPTERD_")} - {
        "ADAPTERD_STATUS_FD",
        "ADAPTERD_PARENT_PID",
    }, sorted(names)
    assert {"PATH", "HF_ENDPOINT", "HF_TOKEN", "HF_HOME", "FOR_JOBS"} <= names, sorted(names)
    for value in (*secrets.values(), logs_token):
        assert value.encode() not in server_environ
    assert b"FOR_JOBS=listed" in server_environ
