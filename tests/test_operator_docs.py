"""deploy/README.md answers the questions an operator asks before and while running a fleet (issue
49): how many partitions for N GPUs and k jobs per GPU, how long a dead static member keeps its
partitions, and what the lag gauge and the idle-slot alert ask one to do; and its numbers are the
code's own (the defaults, the metric and the alert names)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from daemon.ops import metrics
from daemon.settings import Settings

ROOT = Path(__file__).parents[1]
DEPLOY = (ROOT / "deploy" / "README.md").read_text()


def section(heading: str) -> str:
    """The text under a heading, to the next heading of any level."""
    start = DEPLOY.index(heading)
    following = re.search(r"^#{2,3} ", DEPLOY[start + len(heading) :], re.MULTILINE)
    return DEPLOY[start : start + len(heading) + (following.start() if following else len(DEPLOY))]


def test_the_partitions_rule_counts_gpus_times_jobs_per_gpu_with_a_worked_example() -> None:
    text = " ".join(section("### How many partitions").split())
    assert "`max_jobs_per_gpu`" in text and "(hosts) x (the largest host's GPUs) x (`max_jobs_per_gpu`)" in text
    hosts, gpus, per_gpu = (
        int(n) for n in re.search(r"For (\d+) hosts of (\d+) GPUs packing (\d+) jobs a GPU", text).groups()
    )  # type: ignore[union-attr]
    assert f"at least {hosts} x {gpus} x {per_gpu} = {hosts * gpus * per_gpu}; without packing, {hosts * gpus}." in text
    assert "AdapterdSlotIdleWhileRequestsWait" in text


def test_a_dead_static_members_partitions_wait_for_the_session_timeout_the_settings_default_to() -> None:
    text = " ".join(DEPLOY.split())
    said = re.search(r"until `session_timeout_ms` \((\d+) s by default\) has passed without a heartbeat", text)
    assert said is not None and int(said.group(1)) * 1000 == Settings.model_fields["session_timeout_ms"].default
    assert "A host without `group_instance_id` that stops cleanly leaves the group at once" in text


def test_the_lag_gauge_and_the_idle_slot_alert_say_what_to_do_and_name_real_things() -> None:
    text = " ".join(DEPLOY.split())
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "adapterd-rules.yml").read_text())
    alerts = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    assert {"AdapterdPartitionLagGrowing", "AdapterdSlotIdleWhileRequestsWait"} <= alerts
    assert metrics.CONSUMER_LAG._name == "adapterd_consumer_lag"  # the gauge the doc explains
    lag = text[
        text.index("- `adapterd_consumer_lag{partition}` is") : text.index("- AdapterdSlotIdleWhileRequestsWait (")
    ]
    idle = text[text.index("- AdapterdSlotIdleWhileRequestsWait (") : text.index("Each job's output")]
    assert (
        "add GPUs or hosts" in lag and "turn on packing" in lag and "[How many partitions](#how-many-partitions)" in lag
    )
    for cause in ("add partitions", "`resources.gpus`", "free share", "backoff", "`/healthz` 503"):
        assert cause in idle, cause
    for command in re.findall(r"`adapterd (\w+)[^`]*`", lag + idle):  # each command it names is one the CLI has
        assert command in {"status", "jobs"}, command


def test_the_upgrade_syncs_the_same_extras_as_the_install() -> None:
    """`uv sync` removes every package its flags do not name: an upgrade that leaves out `--extra lm-eval` uninstalls
    lm-eval, and every evaluation `task` suite fails from then on (issue 63)."""
    syncs = re.findall(r"uv sync (--frozen[^\n#]*)", DEPLOY)
    install = next(flags for flags in syncs if "--no-dev" in flags)
    upgrade = re.search(r"git pull && sudo /opt/uv/bin/uv sync ([^\n]*)", DEPLOY)
    assert upgrade is not None
    assert sorted(upgrade.group(1).split()) == sorted(install.split())
