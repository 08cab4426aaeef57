"""The daemon under systemd: the unit file verifies, and `Type=notify` messages arrive on a real socket."""

import json
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from daemon.executors import SWITCH_INTERVAL_S
from daemon.settings import Settings
from schemas import Rejected
from testbed.client import submit, terminal_events
from testbed.processes import DaemonProcess, NotifySocket, http_get, metric
from tests.helpers import sft_request

UNIT = Path(__file__).parents[3] / "deploy" / "adapterd.service"


def unit_directives() -> dict[str, list[str]]:
    directives: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            directives.setdefault(key.strip(), []).append(value.strip())
    return directives


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_unit_file_verifies(tmp_path: Path) -> None:
    # verify checks that ExecStart's program exists: point it at this checkout's virtual environment.
    installed = UNIT.read_text().replace(
        "/opt/adapterd/.venv/bin/adapterd", str(Path(sys.executable).parent / "adapterd")
    )
    unit = tmp_path / "adapterd.service"
    unit.write_text(installed)
    result = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", f"systemd ignored part of the unit: {result.stderr}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_rates_the_units_exposure_low(tmp_path: Path) -> None:
    installed = UNIT.read_text().replace(
        "/opt/adapterd/.venv/bin/adapterd", str(Path(sys.executable).parent / "adapterd")
    )
    unit = tmp_path / "adapterd.service"
    unit.write_text(installed)
    result = subprocess.run(["systemd-analyze", "security", "--offline=yes", str(unit)], capture_output=True, text=True)
    [level] = re.findall(r"Overall exposure level for adapterd.service: ([0-9.]+)", result.stdout)
    assert float(level) < 4.5, result.stdout[-3000:]  # 7.6 before the hardening above; 10 is a unit with none


def test_unit_file_asks_for_what_the_daemon_does() -> None:
    unit = unit_directives()
    assert unit["Type"] == ["notify"] and unit["NotifyAccess"] == ["main"] and unit["WatchdogSec"]
    assert unit["Restart"] == ["on-failure"] and unit["KillMode"] == ["mixed"]
    assert unit["RestartPreventExitStatus"] == ["2"]  # what `run` exits with on bad settings: never restarted for ever
    assert int(unit["TimeoutStopSec"][0]) > 60  # the default drain_timeout_s, for checkpoints
    assert unit["LoadCredential"] == [
        "hub-token:/etc/adapterd/hub-token",
        "event-signing-key:/etc/adapterd/event-signing-key.pem",
    ]
    assert "ADAPTERD_HUB_TOKEN_FILE=%d/hub-token" in unit["Environment"]
    assert (
        "ADAPTERD_EVENT_SIGNING_KEY_FILE=%d/event-signing-key" in unit["Environment"]
    )  # every event it publishes is signed
    assert unit["NoNewPrivileges"] == ["yes"] and unit["ProtectSystem"] == ["strict"]
    assert unit["ReadWritePaths"] == ["/var/lib/adapterd"] and unit["StateDirectory"] == ["adapterd"]
    # The hardening the daemon can run under: no capability, namespace, realtime or kernel log; only
    # the socket families it uses; files not world-readable. None of them closes the GPUs' devices.
    assert unit["CapabilityBoundingSet"] == [""] and unit["RestrictNamespaces"] == ["yes"] and unit["UMask"] == ["0027"]
    assert unit["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6 AF_NETLINK"] and unit[
        "SystemCallArchitectures"
    ] == ["native"]
    assert (
        unit["ProtectKernelLogs"] == ["yes"]
        and unit["RestrictRealtime"] == ["yes"]
        and unit["ProtectHostname"] == ["yes"]
    )
    assert not {"PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock"} & set(unit)


async def test_ready_watchdog_health_and_stopping_over_a_real_notify_socket(settings: Settings, tmp_path: Path) -> None:
    notify = NotifySocket(tmp_path / "notify.sock")
    one_gpu = settings.model_copy(update={"gpus": ["0"], "warm_child": False})
    daemon = DaemonProcess(
        one_gpu, tmp_path / "daemon.log", extra_env=notify.environment(watchdog_usec=1_000_000)
    ).start()
    try:
        ready = await notify.wait_for("READY=1", timeout_s=60)
        assert ready == "READY=1"
        assert any(line.startswith("STATUS=joined group") for line in notify.lines)
        await notify.wait_for("WATCHDOG=1", timeout_s=10)
        address = one_gpu.metrics_address
        assert address is not None
        code, body = http_get(address, "/healthz")
        assert code == 200 and json.loads(body)["joined_group"] is True

        # A request for more GPUs than the host has is rejected, and counted.
        await submit(settings, sft_request("two-gpus", resources={"gpus": 2}))
        rejected = (await terminal_events(settings, {"two-gpus"}))["two-gpus"][-1]
        assert isinstance(rejected, Rejected) and rejected.reason == "resources"
        assert rejected.errors[0].path == "resources.gpus" and "this host has 1 GPU" in rejected.errors[0].message
        _, text = http_get(address, "/metrics")
        assert metric(text.decode(), "adapterd_requests_rejected_total", reason="resources") == 1.0
        assert metric(text.decode(), "adapterd_slots") == 1.0
        _, status = http_get(address, "/status")
        assert json.loads(status)["slots"] == {"total": 1, "busy": 0, "free": ["0"]}

        assert daemon.process is not None
        daemon.process.send_signal(signal.SIGTERM)
        await notify.wait_for("STOPPING=1", timeout_s=30)
        assert daemon.stop() == 0
        # The start-up line says where artifacts go, and whose the token is (the local Hub's one user); read
        # once the daemon has exited, as READY may come before the line is written.
        [started] = [line for line in daemon.log_lines() if line.get("event") == "daemon.started"]
        assert (started["sink"], started["token_from"], started["hub_user"]) == ("hub", "hub_token", "adapterd-test"), (
            started
        )
        assert started["switch_interval_s"] == SWITCH_INTERVAL_S  # the loop favoured (daemon/executors.py)
    finally:
        daemon.stop()
        notify.close()
