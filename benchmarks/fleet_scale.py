"""The fleet at scale (issue 59): `jobs`, `get`, a restarted daemon's view of the fleet and its announcer and
dispatcher at rest, on a week of a 256-GPU fleet's history; prints one line, `FLEET_SCALE key=value ...`.

    uv run python -m benchmarks.fleet_scale                   # 256 GPUs, 7 days, 10,000 waiting (1.04M events)
    uv run python -m benchmarks.fleet_scale --reuse DIR       # build the history once into DIR, copy it from there
    uv run python -m benchmarks.fleet_scale --small           # 8 GPUs, 1 day, 300 waiting: a check in a minute
    uv run python -m benchmarks.fleet_scale --restarts 8      # and 8 restarts more: the loop lag's spread

On a local broker (daemon/local_broker) of its own, with the topics `adapterd topics --partitions 4` makes under the
shipped names, it writes the history benchmarks/fleet_history.py describes (every event signed by the fleet's key,
as the daemon signs), then:
1. starts a daemon on it (a host of the fleet, restarted after the history: `adapterd run` through
   testbed/loop_probe.py) and waits for its fleet view to be whole; where the checkout has the table's keeper
   (daemon/table/keeper.py), also until the keepers' group has committed the whole history: the one-time cost of
   deploying the table on a fleet with a history (its time and events/s). Then stops it.
2. times `adapterd jobs` and `adapterd get ID` (a finished request) as a user runs them: `python -m daemon.cli.app`
   with a config file that names the broker, the classes and the fleet's public key (verification on), the wall
   time of the whole command, its start included, over `--rounds` (one where a round takes over a minute).
3. starts the daemon again and measures the time from its start to its fleet view whole (`FleetView.caught_up`,
   its process start included) and the loop's worst lag meanwhile (and after, at rest); then, at rest with the
   backlog, the CPU per second of its announcer and its dispatcher (each task's thread CPU and what it handed to
   thread pools, testbed/loop_probe.py), and of the whole process, over `--windows` windows.

The daemon: one CPU slot (`gpus = []`), no warm child (a fork server importing torch would take one of this
machine's two cores while the view is timed; a GPU host has cores to spare), the local sink (no Hub token), the
classes urgent, default and batch (batch preemptible). Every waiting request asks for 2 or 4 GPUs: the host has room
for one, reads its queues' heads every turn and can take none, so its dispatcher works at rest as a host with room
does, and nothing runs. (A cap on the teams, which the history's running jobs hold, does not keep it so: today's
daemon claims before its view is whole, and with an empty view no team is at its cap; seen: a claim 1.6 s before
`fleet.usage_read`.) The targets (issue 59) are printed beside each figure, not asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from benchmarks.fleet_history import CLASSES, Built, Fleet, build
from daemon.kafka.options import kafka_options
from daemon.local_broker import LocalKafka, free_port
from daemon.settings import Settings
from daemon.settings.fleet import PriorityClass
from daemon.table.topic import COMPACTED, keeper_group
from schemas.signing import EventSigner, public_key_text
from testbed.fleet_keys import fleet_keys
from testbed.processes import DaemonProcess, settings_environment

SMALL = Fleet(gpus=8, days=1.0, progress_s=60.0, waiting=300, large=3, teams=4)
PARTITIONS = 4
HOST = "bench-host"
TARGETS = {  # issue 59's: each at most (the CPU figures under)
    "jobs_s": 3.0,
    "get_s": 2.0,
    "view_whole_s": 10.0,
    "loop_lag_max_ms": 100.0,
    "announcer_cpu": 0.05,
    "dispatcher_cpu": 0.05,
}
MAX_AGE_S = 3600.0  # a kept history older than this is built again: the view reads the last four hours of it
SETTLE_S = 6.0  # after the view is whole, before the CPU windows: the announcer's first rounds


def say(text: str) -> None:
    print(text, flush=True)


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} [{min(values):.2f}, {max(values):.2f}] over {len(values)}"


def verdict(key: str, value: float | None) -> str:
    if value is None:
        return "n/a"
    target = TARGETS[key]
    met = value < target if key.endswith("_cpu") else value <= target
    return f"target {'<' if key.endswith('_cpu') else '<='} {target:g}: {'met' if met else 'NOT MET'}"


def daemon_settings(root: Path, bootstrap: str, keys: dict[str, Any], fleet: Fleet) -> Settings:
    """The host's settings (module docstring); the topics keep their shipped names (the broker is this run's)."""
    return Settings(
        bootstrap_servers=bootstrap,
        host=HOST,
        work_dir=root / "work",
        gpus=[],
        job_slots=1,
        warm_child=False,
        log_format="json",
        metrics_address=f"127.0.0.1:{free_port()}",
        priority_classes=[PriorityClass(name=name, preemptible=name == "batch") for name in CLASSES],
        default_priority_class="default",
        **keys,
    )


def toml(value: Any) -> str:
    """A settings value as TOML: tables inline (testbed's `write_config` writes JSON, which a table is not)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml(v)}" for k, v in value.items() if v is not None) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(toml(v) for v in value) + "]"
    return json.dumps(value)


def write_config(settings: Settings, path: Path) -> Path:
    """The settings as the TOML file an operator or a user writes."""
    fields = settings.model_dump(mode="json", exclude={"hub_token", "sasl_password"})
    path.write_text("".join(f"{name} = {toml(value)}\n" for name, value in fields.items() if value is not None))
    return path


def user_settings(settings: Settings, public: str) -> Settings:
    """A user's settings on a workstation: the broker, the classes and the fleet's public key; no private key."""
    fields = settings.model_dump(exclude={"event_signing_key_file", "retry_key_file", "metrics_address"})
    return Settings(**{**fields, "event_verify_keys": [public], "work_dir": settings.work_dir.parent / "user"})


def adapterd(config: Path, *args: str, check: bool = True) -> tuple[float, str]:
    """One `adapterd` command as a user runs it: its wall time, start included, and its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADAPTERD_")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", *args, "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    wall = time.monotonic() - started
    if check and done.returncode != 0:
        raise RuntimeError(f"adapterd {' '.join(args)} exited with {done.returncode}: {done.stderr[-2000:]}")
    return wall, done.stdout


def timed_rounds(config: Path, rounds: int, *args: str) -> tuple[list[float], str]:
    """`rounds` runs of the command (one only where the first takes over a minute)."""
    walls, out = [], ""
    for _ in range(rounds):
        wall, out = adapterd(config, *args)
        walls.append(wall)
        if wall > 60:
            break
    return walls, out


class ProbedDaemon:
    """`adapterd run` under testbed/loop_probe.py, and what its probe file says."""

    def __init__(self, settings: Settings, root: Path, name: str) -> None:
        self.probe = root / f"{name}-probe.json"
        self.process = DaemonProcess(
            settings,
            root / f"{name}.log",
            command=[sys.executable, "-m", "testbed.loop_probe", "run"],
            environment={**settings_environment(settings), "LOOP_PROBE_FILE": str(self.probe)},
        )
        self.started = 0.0

    def start(self) -> ProbedDaemon:
        self.started = time.time()
        self.process.start()
        return self

    def state(self) -> dict[str, Any]:
        try:
            found: dict[str, Any] = json.loads(self.probe.read_text())
            return found
        except (OSError, ValueError):
            return {}

    async def whole(self, timeout_s: float) -> float:
        """Seconds from the process's start to its view whole."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            at = self.state().get("view_whole_at")
            if at is not None:
                return float(at) - self.started
            assert self.process.process is not None
            if self.process.process.poll() is not None:
                raise RuntimeError(
                    f"the daemon exited with {self.process.process.returncode}; see {self.process.log_path}"
                )
            await asyncio.sleep(0.2)
        raise TimeoutError(f"the daemon's view not whole after {timeout_s}s; see {self.process.log_path}")

    def lag_max_ms(self, since: float, until: float) -> float:
        lags = [lag for at, lag in self.state().get("lags", []) if since <= at <= until]
        return max(lags, default=0.0) * 1000

    def published(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for line in self.process.log_lines():
            if line.get("event") == "event.published":
                counts[str(line.get("type"))] = counts.get(str(line.get("type")), 0) + 1
        return counts

    def stop(self) -> None:
        self.process.stop()


async def restarts(settings: Settings, root: Path, count: int, timeout_s: float) -> None:
    """The daemon restarted `count` times more on the same history: the spread of its loop's worst lag until its view
    is whole, and over SETTLE_S after (the keeper's restores run then)."""
    until, after = [], []
    for n in range(count):
        daemon = ProbedDaemon(settings, root, f"again-{n}").start()
        try:
            whole_at = daemon.started + await daemon.whole(timeout_s)
            await asyncio.sleep(SETTLE_S)
            until.append(daemon.lag_max_ms(daemon.started, whole_at))
            after.append(daemon.lag_max_ms(whole_at, time.time()))
        finally:
            daemon.stop()
    over = sum(1 for lag in until if lag > TARGETS["loop_lag_max_ms"])

    def ms(values: list[float]) -> str:
        return f"median {statistics.median(values):.0f} ms [{min(values):.0f}, {max(values):.0f}]"

    say(
        f"fleet_scale: {count} restarts more: worst loop lag until whole {ms(until)} ({over} of {count} over "
        f"{TARGETS['loop_lag_max_ms']:g}); over the {SETTLE_S:g}s after, {ms(after)}"
    )


def task_cpu(state: dict[str, Any], name: str) -> float:
    """The CPU seconds of a task's label, on the loop and in the pools it handed work to."""
    return float(state.get("cpu", {}).get(name, 0.0)) + float(state.get("pool_cpu", {}).get(name, 0.0))


def cpu_rates(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """The announcer's, the dispatcher's and the process's CPU seconds per second between two probe states."""
    elapsed = after["time"] - before["time"]
    rates = {
        key: (task_cpu(after, label) - task_cpu(before, label)) / elapsed
        for key, label in (("announcer", "fleet-announcer"), ("dispatcher", "fleet-dispatcher"))
    }
    rates["process"] = (after["process_cpu"] - before["process_cpu"]) / elapsed
    return rates


async def rest_cpu(
    daemon: ProbedDaemon, windows: int, window_s: float
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """The CPU per second at rest (`cpu_rates`), per window and over them all."""
    states = [daemon.state()]
    for _ in range(windows):
        await asyncio.sleep(window_s)
        states.append(daemon.state())
    per_window = [cpu_rates(before, after) for before, after in zip(states, states[1:], strict=False)]
    return {key: [rates[key] for rates in per_window] for key in per_window[0]}, cpu_rates(states[0], states[-1])


async def keeper_caught_up(settings: Settings, ends: dict[TopicPartition, int], timeout_s: float) -> float | None:
    """When (epoch seconds) the keepers' group had committed every events partition up to `ends`; None past the
    timeout."""
    deadline = time.monotonic() + timeout_s
    said = time.monotonic()
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    try:
        while time.monotonic() < deadline:
            committed = await admin.list_consumer_group_offsets(keeper_group(settings.group_id))
            if all(tp in committed and committed[tp].offset >= end for tp, end in ends.items()):
                return time.time()
            if time.monotonic() >= said + 60:
                done = sum(min(committed[tp].offset, end) for tp, end in ends.items() if tp in committed)
                say(f"fleet_scale: the keepers' group has committed {done:,} of {sum(ends.values()):,} events")
                said = time.monotonic()
            await asyncio.sleep(0.5)
    finally:
        await admin.close()
    return None


def table_bytes(data: Path, topic: str) -> int:
    """The bytes of the state topic's log segments in the broker's folder."""
    return sum(path.stat().st_size for path in (data / "logs").glob(f"{topic}-*/*.log"))


async def compact_table(settings: Settings, data: Path, timeout_s: float) -> tuple[int, int, float]:
    """Let the broker compact the table the keeper just wrote, as it does within `segment.ms` (an hour) of its
    writes: the state topic's segments rolled at once (`segment.ms` 1 s, then set back), until its log stops
    shrinking (three minutes at most). The bytes before and after, and the seconds it took."""
    started = time.monotonic()
    before = table_bytes(data, settings.state_topic)
    admin = AIOKafkaAdminClient(**kafka_options(settings))
    await admin.start()
    topic = ConfigResource(ConfigResourceType.TOPIC, settings.state_topic, configs={**COMPACTED, "segment.ms": "1000"})
    try:
        await admin.alter_configs([topic])
        sizes = [before]
        while time.monotonic() - started < timeout_s:
            await asyncio.sleep(5)
            sizes.append(table_bytes(data, settings.state_topic))
            # Done once a cleaning shrank it and the next ones do not: the active segment grows with every write (a
            # new entry each `queued`), so it is never quite still.
            if len(sizes) > 4 and sizes[-1] < before * 0.9 and sizes[-1] >= sizes[-4]:
                break
    finally:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, settings.state_topic, configs=COMPACTED)])
        await admin.close()
    return before, table_bytes(data, settings.state_topic), time.monotonic() - started


async def end_offsets(settings: Settings) -> dict[TopicPartition, int]:
    """The events topic's end offsets now: the history's end."""
    consumer = AIOKafkaConsumer(**kafka_options(settings), enable_auto_commit=False)
    await consumer.start()
    try:
        tps = [TopicPartition(settings.events_topic, p) for p in range(PARTITIONS)]
        return dict(await consumer.end_offsets(tps))
    finally:
        await consumer.stop()


def kept_ports(data: Path) -> dict[str, int]:
    """The ports a kept broker folder was made with (its server.properties' listeners): a KRaft broker's metadata
    names its controller's address, so a copy starts on the same ports."""
    names = {"PLAINTEXT": "port", "CONTROLLER": "controller_port", "SASL_PLAINTEXT": "sasl_port"}
    for line in (data / "server.properties").read_text().splitlines():
        if line.startswith("listeners="):
            listeners = (item.split("://") for item in line.partition("=")[2].split(","))
            return {names[name]: int(address.rpartition(":")[2]) for name, address in listeners}
    return {}


def history(args: argparse.Namespace, fleet: Fleet, root: Path) -> tuple[Path, dict[str, Any] | None]:
    """The broker's data folder for this run, and what was built there when it is a kept history's copy."""
    data = root / "kafka"
    kept = Path(args.reuse) / "built.json" if args.reuse else None
    if kept is not None and kept.exists():
        said = json.loads(kept.read_text())
        age = time.time() - said["built"]["now"]
        if said["fleet"] == asdict(fleet) and age < MAX_AGE_S:
            started = time.monotonic()
            shutil.copytree(kept.parent / "kafka", data)
            shutil.copytree(kept.parent / "keys", root / "keys")
            say(
                f"fleet_scale: the history kept in {kept.parent} ({age / 60:.0f} min old) copied in "
                f"{time.monotonic() - started:.1f}s"
            )
            return data, said
        say(
            f"fleet_scale: the history kept in {kept.parent} is {age / 60:.0f} min old or of another shape: built again"
        )
    return data, None


async def run(args: argparse.Namespace) -> None:
    fleet = SMALL if args.small else Fleet()
    root = Path(tempfile.mkdtemp(prefix="adapterd-fleet-scale-"))
    broker: LocalKafka | None = None
    daemon: ProbedDaemon | None = None
    try:
        data, kept = history(args, fleet, root)
        broker = LocalKafka(data_dir=data, heap="1g").start()
        keys = (
            fleet_keys(root / "keys")
            if kept is None
            else {
                "event_signing_key_file": root / "keys" / "event-signing-key.pem",
                "retry_key_file": root / "keys" / "retry-key",
            }
        )
        settings = daemon_settings(root, broker.bootstrap_servers, keys, fleet)
        signer = EventSigner.from_file(keys["event_signing_key_file"])
        user = write_config(user_settings(settings, public_key_text(signer.public)), root / "user.toml")
        # On a kept history too: a checkout with topics the history's did not make (the table's) makes them now.
        wall, out = adapterd(user, "topics", "--partitions", str(PARTITIONS))
        say(f"fleet_scale: adapterd topics --partitions {PARTITIONS} ({wall:.1f}s): {' '.join(out.split())[:300]}")
        if kept is None:
            built = await build(settings, signer, fleet, say)
            say(f"fleet_scale: built in {built.seconds:.0f}s ({built.events / built.seconds:,.0f} events/s)")
            if args.reuse:
                broker.stop()
                keep = Path(args.reuse)
                shutil.rmtree(keep, ignore_errors=True)
                keep.mkdir(parents=True)
                shutil.copytree(data, keep / "kafka")
                shutil.copytree(root / "keys", keep / "keys")
                (keep / "built.json").write_text(json.dumps({"fleet": asdict(fleet), "built": built.as_json()}))
                say(f"fleet_scale: the history kept in {keep} for --reuse")
                broker = LocalKafka(data_dir=data, heap="1g", **kept_ports(data)).start()  # type: ignore[arg-type]
                settings = daemon_settings(root, broker.bootstrap_servers, keys, fleet)
                user = write_config(user_settings(settings, public_key_text(signer.public)), root / "user.toml")
        else:
            said = kept["built"]
            built = Built(
                **{**said, "by_type": Counter(said["by_type"]), "running_teams": Counter(said["running_teams"])}
            )
        say(
            f"fleet_scale: history: {fleet.gpus} GPUs on {fleet.hosts} hosts, {fleet.days:g} days, a progress event "
            f"every {fleet.progress_s:g}s and a checkpoint every tenth; {built.events:,} signed events "
            f"({built.bytes / 2**20:,.0f} MiB: {', '.join(f'{k} {v:,}' for k, v in sorted(built.by_type.items()))}), "
            f"{built.requests:,} requests ({built.running} running, {built.waiting:,} waiting, {built.large} of "
            f"them of ~1 MiB), on {PARTITIONS} partitions"
        )
        config = write_config(settings, root / "daemon.toml")
        del config  # written for a reader of a kept run (ADAPTERD_BENCH_KEEP): the daemon takes its environment
        ends = await end_offsets(settings)

        # 1. the first start on the history: the table's keeper catches up, where there is one
        daemon = ProbedDaemon(settings, root, "first").start()
        whole = await daemon.whole(args.timeout)
        say(f"fleet_scale: first start: view whole {whole:.1f}s after the daemon's start")
        keeper_s = None
        if find_spec("daemon.table.keeper") is not None:
            kept_at = await keeper_caught_up(settings, ends, args.keeper_timeout)
            keeper_s = None if kept_at is None else kept_at - daemon.started
            total = sum(ends.values())
            if keeper_s is None:
                say(f"fleet_scale: the keepers' group did not commit the history within {args.keeper_timeout:.0f}s")
            else:
                say(
                    f"fleet_scale: the table's keeper folded the history ({total:,} events) {keeper_s:.1f}s after the "
                    f"daemon's start "
                    f"({total / max(keeper_s, 1e-9):,.0f} events/s): once, on deploying the table"
                )
                if args.compact:
                    before, after, took = await compact_table(settings, data, 180.0)
                    say(
                        f"fleet_scale: the table compacted by the broker (segment.ms 1 s for it, then set back): "
                        f"{before / 2**20:,.0f} -> {after / 2**20:,.0f} MiB in {took:.0f}s"
                    )
        else:
            say("fleet_scale: no table keeper on this checkout (daemon/table/keeper.py): today's path")
        await asyncio.sleep(SETTLE_S)
        first_published = daemon.published()
        daemon.stop()
        daemon = None

        # 2. the commands
        jobs, listing = timed_rounds(user, args.rounds, "jobs")
        listed = max(0, len(listing.splitlines()) - 1)
        say(
            f"fleet_scale: adapterd jobs: {spread(jobs)} s ({listed:,} requests listed); {verdict('jobs_s', min(jobs))}"
        )
        one = built.done_ids[len(built.done_ids) // 2] if built.done_ids else "run-000-00000"
        got, shown = timed_rounds(user, args.rounds, "get", one)
        say(
            f"fleet_scale: adapterd get {one}: {spread(got)} s ({len(shown.splitlines())} lines); "
            f"{verdict('get_s', min(got))}"
        )

        # 3. the restarted daemon
        daemon = ProbedDaemon(settings, root, "restarted").start()
        whole = await daemon.whole(args.timeout)
        whole_at = daemon.started + whole
        lag_whole = daemon.lag_max_ms(daemon.started, whole_at)
        say(
            f"fleet_scale: restarted: view whole {whole:.2f}s after the daemon's start; "
            f"{verdict('view_whole_s', whole)}"
        )
        say(f"fleet_scale: loop lag until then: worst {lag_whole:.0f} ms; {verdict('loop_lag_max_ms', lag_whole)}")
        await asyncio.sleep(SETTLE_S)
        cpu, rest = await rest_cpu(daemon, args.windows, args.window_s)
        lag_rest = daemon.lag_max_ms(whole_at, time.time())
        say(f"fleet_scale: loop lag after, at rest: worst {lag_rest:.0f} ms")
        for key in ("announcer", "dispatcher"):
            say(
                f"fleet_scale: {key} CPU at rest: {rest[key]:.3f} of a core over {args.windows * args.window_s:g}s "
                f"(windows of {args.window_s:g}s: {spread(cpu[key])}); {verdict(key + '_cpu', rest[key])}"
            )
        say(f"fleet_scale: the daemon's process at rest: {rest['process']:.3f} of a core ({spread(cpu['process'])})")
        state = daemon.state()
        busiest = sorted(
            ((task_cpu(state, label), label) for label in set(state.get("cpu", {})) | set(state.get("pool_cpu", {}))),
            reverse=True,
        )[:6]
        say(
            "fleet_scale: the restarted daemon's CPU by task since its start: "
            + ", ".join(f"{label} {s:.1f}s" for s, label in busiest)
        )
        published = daemon.published()
        daemon.stop()
        daemon = None
        if args.restarts:
            await restarts(settings, root, args.restarts, args.timeout)
        ran = sum(counts.get(kind, 0) for counts in (first_published, published) for kind in ("accepted", "started"))
        say(f"fleet_scale: the host published {first_published} at its first start, {published} restarted")
        if ran:
            say(f"fleet_scale: WARNING: the host started {ran} jobs: not at rest")
        lag = max(lag_whole, lag_rest)
        figures = {
            "events": built.events,
            "requests": built.requests,
            "waiting": built.waiting,
            "jobs_s": round(min(jobs), 2),
            "get_s": round(min(got), 2),
            "view_whole_s": round(whole, 2),
            "loop_lag_max_ms": round(lag),
            "announcer_cpu": round(rest["announcer"], 4),
            "dispatcher_cpu": round(rest["dispatcher"], 4),
            "process_cpu": round(rest["process"], 4),
            "keeper_catch_up_s": None if keeper_s is None else round(keeper_s, 1),
        }
        say("FLEET_SCALE " + " ".join(f"{key}={'n/a' if value is None else value}" for key, value in figures.items()))
        say("FLEET_SCALE targets: " + "; ".join(f"{key} {verdict(key, figures[key])}" for key in TARGETS))
    finally:
        if daemon is not None:
            daemon.stop()
        if broker is not None:
            broker.stop()
        if os.environ.get("ADAPTERD_BENCH_KEEP"):
            say(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="8 GPUs, 1 day, 300 waiting requests: a quick check")
    parser.add_argument("--reuse", help="a folder to keep the built history in, and copy it from on later runs")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each command (one where it takes over 60 s)")
    parser.add_argument("--windows", type=int, default=3, help="windows of the CPU at rest")
    parser.add_argument(
        "--restarts", type=int, default=0, help="restart the daemon so many times more, for the loop lag's spread"
    )
    parser.add_argument("--window-s", type=float, default=10.0)
    parser.add_argument("--timeout", type=float, default=300.0, help="the longest a daemon's view is waited for")
    parser.add_argument(
        "--compact",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the keeper's catch-up, have the broker compact the table before the measures, as it does within "
        "an hour of the writes (--no-compact: measured as just written)",
    )
    parser.add_argument(
        "--keeper-timeout", type=float, default=1200.0, help="the longest the keeper's catch-up is waited for"
    )
    args = parser.parse_args()
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
