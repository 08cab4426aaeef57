"""A real local Ray cluster (a head node, and worker nodes where a test asks for several) that tests and
benchmarks.ray_job start and stop: the Jobs API the daemon submits jobs bigger than one host to, on this machine, with
ports of its own so that several may run side by side."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from types import TracebackType

# Every process of the cluster inherits this variable (set to the cluster's temp dir): the job drivers run in
# sessions of their own and Ray's workers rename themselves (`ray::IDLE`), so neither the process group nor the
# command line finds them all; the environment a process was started with does.
TAG = "TESTBED_RAY_CLUSTER"
# `ray start --block` stops its services on SIGTERM; past this, what is left is killed.
GRACE_S = 20.0
CHECKOUT = Path(__file__).resolve().parents[1]
# A head that exits before it answers is started again with other ports, this many times in all, on its first start
# only: a restart after an outage must come back at the address it had.
STARTS = 3
# Below Linux's default ephemeral range (32768-60999, where every bind to port 0 and every outgoing connection takes
# its port, our own workers', brokers' and clients' included) and above Ray's default worker range (10002-19999).
QUIET_PORTS = range(20000, 32768)
# Every node's own ports; the head has these and the cluster's (its GCS, dashboard and client server).
NODE_OPTIONS = (
    "--node-manager-port",
    "--object-manager-port",
    "--metrics-export-port",
    "--runtime-env-agent-port",
    "--dashboard-agent-grpc-port",
    "--dashboard-agent-listen-port",
)
OPTIONS = ("--port", "--dashboard-port", "--ray-client-server-port", *NODE_OPTIONS)


def quiet_ports(count: int) -> list[int]:
    """`count` distinct ports from QUIET_PORTS that no socket holds now. A port the kernel hands out for port 0 (as
    `daemon.local_broker.free_port` takes) can be taken again by any process's next connection before `ray start`
    binds it (CI once saw a head exit before it answered, its log out of reach; a GCS port taken meanwhile makes
    exactly that exit); a port the kernel never hands out can only be taken by another choice like this one."""
    ports: list[int] = []
    for port in random.sample(QUIET_PORTS, len(QUIET_PORTS)):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == count:
            return ports
    raise RuntimeError(f"fewer than {count} ports free in {QUIET_PORTS}")


class HeadExited(RuntimeError):
    """`ray start` ended before its dashboard answered."""


class RayCluster:
    """A Ray head started for the tests: `ray start --head --block` in its own session; with `nodes` above 1, as many
    nodes in all, each a `ray start --address` of its own with `num_cpus` (standing in for hosts: a placement
    group's STRICT_SPREAD puts each of its bundles on another one)."""

    def __init__(self, directory: Path, num_cpus: int = 2, nodes: int = 1) -> None:
        self.directory = directory
        self.num_cpus = num_cpus
        # Each node on a loopback address of its own. A node joining a cluster needs
        # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1, under which Ray turns the address 127.0.0.1 (only that one) into the
        # machine's outward address: a cluster of several nodes has its head on 127.0.0.2.
        self.node_ip = "127.0.0.1" if nodes == 1 else "127.0.0.2"
        self.node_ips = [f"127.0.0.{3 + i}" for i in range(nodes - 1)]
        self.node_processes: list[subprocess.Popen[bytes]] = []
        # Ray's unix sockets live under the temp dir and must stay under 107 bytes: a pytest tmp_path is too long.
        self.temp_dir = Path(f"/tmp/ar-{uuid.uuid4().hex[:8]}")
        self.log_path = directory / "ray.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.answered = False  # once it has, its ports are its address and stay
        self._choose_ports()

    def _choose_ports(self) -> None:
        # Kept across stops, so that a cluster stopped (an outage) comes back at the same address.
        ports = iter(quiet_ports(len(OPTIONS) + len(NODE_OPTIONS) * len(self.node_ips)))  # one choice: all distinct
        self.ports = {option: next(ports) for option in OPTIONS}
        self.node_ports = [{option: next(ports) for option in NODE_OPTIONS} for _ in self.node_ips]
        self.address = f"http://127.0.0.1:{self.ports['--dashboard-port']}"

    def command(self) -> list[str]:
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block"]
        command += ["--num-cpus", str(self.num_cpus), "--disable-usage-stats", "--include-dashboard=true"]
        command += ["--dashboard-host", "127.0.0.1", "--node-ip-address", self.node_ip]
        command += ["--temp-dir", str(self.temp_dir)]
        return command + self._port_options(self.ports)

    def node_command(self, index: int) -> list[str]:
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", "--disable-usage-stats"]
        command += ["--address", f"{self.node_ip}:{self.ports['--port']}", "--num-cpus", str(self.num_cpus)]
        command += ["--node-ip-address", self.node_ips[index]]
        return command + self._port_options(self.node_ports[index])

    @staticmethod
    def _port_options(ports: dict[str, int]) -> list[str]:
        options = [item for option, port in ports.items() for item in (option, str(port))]
        # Workers bind ports the kernel picks (0): Ray's default range 10002-19999 is shared by every cluster on
        # the machine, and a fixed range of our own could be taken by anything between two starts.
        options += ["--min-worker-port", "0", "--max-worker-port", "0"]
        # The object store's default is 30% of memory; the tests move nothing large through it.
        return options + ["--object-store-memory", str(100_000_000)]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # the tests' own cluster, never another
        env.update(
            {
                TAG: str(self.temp_dir),
                "RAY_DEDUP_LOGS": "0",  # each worker's lines as they are, for the tests to read
                "RAY_USAGE_STATS_ENABLED": "0",
                # Ray turns --node-ip-address 127.0.0.1 into the machine's outward address; this keeps the GCS,
                # raylet and workers on the loopback (its cost: no other node may join; nodes set it again).
                "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                # On SIGTERM the node waits (30 s by default) for the GCS to drain it before stopping its
                # processes; a test's outage is meant to be abrupt.
                "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
                # Ray's memory monitor kills workers when the machine's memory runs short, which on a shared
                # test machine is other sessions' doing, not the job's.
                "RAY_memory_monitor_refresh_ms": "0",
                # A driver with `uv run` among its ancestors (pytest under `uv run`, above this cluster) has Ray
                # start its workers through `uv run` too, which syncs the venv first: they run this venv's Python
                # as they are.
                "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0",
                # Job entrypoints (`python ...`) and workers run this venv's Python and import this checkout.
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
                "PYTHONPATH": os.pathsep.join(p for p in (str(CHECKOUT), env.get("PYTHONPATH", "")) if p),
            }
        )
        return env

    def start(self, timeout_s: float = 120) -> None:
        """Start the head; returns once GET {address}/api/version answers 200. A head that never answered yet and
        exits first is started again on other ports, STARTS times in all; the error names each exit's last log lines."""
        if self.running():
            return
        exits = []
        for _ in range(1 if self.answered else STARTS):
            try:
                self._start_once(timeout_s)
            except HeadExited as exited:
                exits.append(str(exited))
                if not self.answered:
                    self._choose_ports()
                continue
            self.answered = True
            self._start_nodes(timeout_s)
            return
        raise RuntimeError("\n".join(exits))

    def _start_nodes(self, timeout_s: float) -> None:
        """Start the worker nodes and return once the dashboard lists every node alive."""
        for index in range(len(self.node_ips)):
            with (self.directory / f"node-{index + 1}.log").open("ab") as log:
                self.node_processes.append(
                    subprocess.Popen(
                        self.node_command(index),
                        env={**self.environment(), "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"},
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                        cwd=self.directory,
                    )
                )
        deadline = time.monotonic() + timeout_s
        while self.alive_nodes() < 1 + len(self.node_ips):
            if any(node.poll() is not None for node in self.node_processes) or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"a node of the Ray cluster did not join in {timeout_s} s (see {self.directory})")
            time.sleep(0.5)  # an external process's join: nothing to await but the dashboard's word

    def alive_nodes(self) -> int:
        """How many of the cluster's nodes the dashboard says are alive."""
        try:
            with urllib.request.urlopen(f"{self.address}/nodes?view=summary", timeout=5) as answer:
                nodes = json.load(answer)["data"]["summary"]
        except (urllib.error.URLError, OSError, ValueError, KeyError):
            return 0
        return sum(1 for node in nodes if node.get("raylet", {}).get("state") == "ALIVE")

    def _start_once(self, timeout_s: float) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        start = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # its own process group, which stop() signals as a whole
                cwd=self.directory,
            )
        deadline = time.monotonic() + timeout_s
        while not self._answers():
            if self.process.poll() is not None:
                with self.log_path.open("rb") as log:
                    log.seek(start)
                    tail = log.read().decode(errors="replace").strip().splitlines()[-3:]
                self.stop()  # what it left of its services, and its temp dir, before another start
                raise HeadExited(
                    f"the Ray head on {self.ports['--port']} exited before it answered ({self.log_path}): "
                    + " | ".join(tail)
                )
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the Ray head did not answer at {self.address} in {timeout_s} s (see {self.log_path})"
                )
            time.sleep(0.5)  # an external process's HTTP server: nothing to await but its answer

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.address}/api/version", timeout=2) as answer:
                return bool(answer.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after 20 s; returns once no process of the cluster is left and
        its temp dir is removed. Never `ray stop`: that stops every Ray cluster on the machine."""
        starts = self._starts()
        for each in starts:
            # Its group, while `ray start` is unreaped (so its pid, the group's id, is no one else's yet).
            if each.returncode is None:
                os.killpg(each.pid, signal.SIGTERM)
            try:
                each.wait(timeout=GRACE_S)
            except subprocess.TimeoutExpired:
                pass
        # What outlived `ray start` (its services past the grace period, job drivers and their watchers in
        # sessions of their own; all carry the tag, `ray start` too): terminated, then killed.
        self._end(self.processes(), signal.SIGTERM, 5)
        self._end(self.processes(), signal.SIGKILL, GRACE_S)
        for each in starts:
            each.wait()
        self.process = None
        self.node_processes = []
        left = self.processes()
        if left:
            raise RuntimeError(f"processes of the Ray cluster {self.temp_dir} outlived SIGKILL: {sorted(left)}")
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _starts(self) -> list[subprocess.Popen[bytes]]:
        """The `ray start` processes this cluster runs, the nodes' before the head's (stopped in that order)."""
        return [*self.node_processes, *([self.process] if self.process is not None else [])]

    def _end(self, pids: set[int], signal_number: int, wait_s: float) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal_number)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while pids and time.monotonic() < deadline:
            for each in self._starts():
                each.poll()  # reaps a `ray start` itself, our child, else a zombie
            pids &= self.processes()
            if pids:
                time.sleep(0.1)

    def processes(self) -> set[int]:
        """The live processes of this cluster: those started with its tag in their environment or its temp dir on
        their command line (zombies, already dead, are not counted)."""
        found = set()
        marker = f"{TAG}={self.temp_dir}".encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if (entry / "stat").read_bytes().rpartition(b")")[2].split()[0] == b"Z":
                    continue
                environ = (entry / "environ").read_bytes().split(b"\0")
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if marker in environ or str(self.temp_dir).encode() in cmdline:
                found.add(int(entry.name))
        return found

    def memory_bytes(self) -> int:
        """The memory of all the cluster's processes together, now: their proportional set sizes (a page shared by
        n processes counts 1/n in each), since the dashboard's modules are forked from one server and share most."""
        total = 0
        for pid in self.processes():
            try:
                for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
            except OSError:
                continue
        return total

    def __enter__(self) -> RayCluster:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stop()
