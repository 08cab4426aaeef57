"""The dashboard and alert rules in deploy/, checked by Prometheus' own tools: `promtool check
rules` and `check config` on what ships, `promtool check metrics` on what the daemon exports, every
metric the dashboard and the rules name exported by the daemon, and one alert shown firing in a
real Prometheus scraping a real daemon. promtool and prometheus come from Debian's `prometheus`
package (`.ci/run` installs it): no Python package ships them, so without them these tests skip, saying
so, except where `ADAPTERD_TESTS_REQUIRE_TOOLS` is set (`.ci/run` sets it), where a missing tool fails."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiokafka import AIOKafkaProducer

from daemon.kafka.options import kafka_options
from daemon.local_broker import free_port
from daemon.settings import Settings
from testbed.client import read_records
from testbed.processes import DaemonProcess

ROOT = Path(__file__).parents[1]
RULES = ROOT / "deploy" / "prometheus" / "adapterd-rules.yml"
CONFIG = ROOT / "deploy" / "prometheus" / "prometheus.example.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "adapterd-dashboard.json"


REQUIRE_TOOLS = "ADAPTERD_TESTS_REQUIRE_TOOLS"


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    reason = f"{name} is not on PATH: Prometheus' tools come from Debian's package (apt-get install prometheus)"
    if os.environ.get(REQUIRE_TOOLS):
        pytest.fail(f"{reason}; {REQUIRE_TOOLS} is set, so a missing tool fails")
    pytest.skip(reason)


def exported_metrics() -> bytes:
    """The daemon's /metrics text with a sample of every metric (a labelled one shows once it has a child)."""
    from prometheus_client import generate_latest

    from daemon.ops import metrics

    metrics.JOBS.labels("succeeded")
    metrics.STAGE_SECONDS.labels("train")
    metrics.CONSUMER_LAG.labels("0")
    metrics.INTAKE_ERRORS.labels("ValueError")
    metrics.rejected("invalid")
    metrics.GPU_JOBS.labels("0")
    metrics.GPU_MEMORY_RESERVED.labels("0")
    metrics.JOB_MEMORY_PEAK.labels("sft")
    metrics.JOB_MEMORY_RATIO.labels("sft")
    metrics.QUEUE_WAITING.labels("batch")
    metrics.STORE_UNTRUSTED.labels("unsigned")
    return generate_latest()


def dashboard_expressions() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def rule_expressions() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_shipped_rules_and_scrape_config() -> None:
    subprocess.run([tool("promtool"), "check", "rules", str(RULES)], check=True, capture_output=True)
    subprocess.run([tool("promtool"), "check", "config", str(CONFIG)], check=True, capture_output=True)


def test_the_daemons_metrics_follow_prometheus_conventions() -> None:
    checked = subprocess.run([tool("promtool"), "check", "metrics"], input=exported_metrics(), capture_output=True)
    assert checked.returncode == 0 and not checked.stdout.strip() and not checked.stderr.strip(), checked


def test_the_dashboard_and_the_rules_name_only_metrics_the_daemon_exports() -> None:
    exported = set(re.findall(rb"^(adapterd_\w+)", exported_metrics(), re.MULTILINE))
    named = {
        name.encode()
        for expr in dashboard_expressions() + rule_expressions()
        for name in re.findall(r"adapterd_\w+", expr)
    }
    assert named and named <= exported, named - exported
    assert {
        b"adapterd_consumer_lag",
        b"adapterd_jobs_total",
        b"adapterd_requests_rejected_total",
        b"adapterd_slots_busy",
    } <= named


def dead_letter_threshold() -> int:
    """How many rejections within AdapterdDeadLetters' window make its rate cross the threshold."""
    (expr,) = [
        rule["expr"]
        for group in yaml.safe_load(RULES.read_text())["groups"]
        for rule in group["rules"]
        if rule.get("alert") == "AdapterdDeadLetters"
    ]
    match = re.fullmatch(r"sum by \(instance\) \(rate\(adapterd_requests_rejected_total\[(\d+)m\]\)\) > ([\d.]+)", expr)
    assert match, f"AdapterdDeadLetters' expression changed shape: {expr}"
    window_m, per_s = match.groups()
    return int(int(window_m) * 60 * float(per_s)) + 1


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as answer:
        return json.loads(answer.read())


async def send_bad(settings: Settings, count: int, first: int) -> None:
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        for index in range(first, first + count):
            await producer.send(settings.requests_topic, b"not json", key=f"bad-{index}".encode())
        await producer.flush()
    finally:
        await producer.stop()


async def wait_for(address: str, query: str, done: Any, timeout_s: float = 60) -> Any:
    """Poll a PromQL query until `done(result)`: Prometheus has no push to wait on."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            result = get(f"http://{address}/api/v1/query?query={urllib.parse.quote(query)}")["data"]["result"]
        except OSError:  # not listening yet
            result = None
        if result is not None and done(result):
            return result
        assert time.monotonic() < deadline, f"{query}: {result}"
        await asyncio.sleep(0.5)


async def wait_for_alert(address: str, name: str, timeout_s: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout_s
    firing: list[str] = []
    while name not in firing and time.monotonic() < deadline:
        alerts = get(f"http://{address}/api/v1/alerts")["data"]["alerts"]
        firing = [alert["labels"]["alertname"] for alert in alerts if alert["state"] == "firing"]
        await asyncio.sleep(0.5)
    return firing


@pytest.mark.slow
async def test_a_real_prometheus_scraping_a_real_daemon_fires_the_dead_letter_alert(
    settings: Settings, tmp_path: Path
) -> None:
    """The shipped rules with their `for:` waits taken out (minutes a test does not have); a burst of
    bad requests makes the DLQ rate cross its threshold and AdapterdDeadLetters fire."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
        for rule in group["rules"]:
            rule.pop("for", None)
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp_path / "rules.yml")],
        "scrape_configs": [{"job_name": "adapterd", "static_configs": [{"targets": [settings.metrics_address]}]}],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    address = f"127.0.0.1:{free_port()}"
    daemon = DaemonProcess(settings.model_copy(update={"warm_child": False}), tmp_path / "daemon.log").start()
    prometheus = subprocess.Popen(
        [
            tool("prometheus"),
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address={address}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "prometheus.log").open("wb"),
    )
    try:
        # One rejection first, scraped, so the burst after it is an increase of a series Prometheus
        # already has (a counter's first sample is only its baseline). The burst is twice what the
        # rule's rate needs over its whole window: a smaller one fires only while the window holds a
        # few seconds of samples (rate() extrapolates them) and stops firing as samples accumulate.
        await send_bad(settings, 1, 0)
        await wait_for(address, "adapterd_requests_rejected_total", lambda result: bool(result))
        burst = 2 * dead_letter_threshold()
        await send_bad(settings, burst, 1)
        await read_records(settings, settings.dlq_topic, 1 + burst, timeout_s=120)  # the daemon has rejected them all
        firing = await wait_for_alert(address, "AdapterdDeadLetters")
        assert "AdapterdDeadLetters" in firing, (firing, (tmp_path / "prometheus.log").read_text()[-2000:])
        up = await wait_for(address, 'up{job="adapterd"}', lambda result: bool(result))
        assert up[0]["value"][1] == "1" and "AdapterdDown" not in firing
        for expr in dashboard_expressions():  # every panel's query evaluates against the real series
            answer = get(f"http://{address}/api/v1/query?query={urllib.parse.quote(expr)}")
            assert answer["status"] == "success", expr
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
        daemon.stop()
