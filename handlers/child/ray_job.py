"""The entry point of a job run on the operator's Ray cluster: `python -m handlers.child.ray_job RUN_FILE`.

The daemon submits it through Ray's Jobs API (daemon/children/ray_jobs.py): it is the Ray job's driver. It places the
job's ranks at once (a placement group of one bundle per rank, or per host for a job across hosts: Ray's gang
scheduling, never adapterd's) and starts one `RankWorker` actor per rank, which runs today's child,
`handlers.child.runner`, as a process of its own with torchrun's worker environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR...): the runner, accelerate and FSDP2 set up the process group themselves, as under `handlers.child.launch`,
so a job trains the same on Ray as on a host's ranks. Not Ray Train's TorchTrainer: it runs the training function in a
thread of the actor (the runner needs a process: its SIGTERM handler, its death with its parent) and brings its own
retries and storage, which would duplicate adapterd's attempts and checkpoint store.

What reaches the daemon: rank 0's status lines (`handlers.protocol` messages), printed here on the driver's stdout,
which is the Ray job's log, as marker lines `@@adapterd <seq> <json>` (`MARKER`; seq counts from 1, so a daemon that
attaches again reads from the log's start and knows what it has seen). Every rank's output reaches the same log
through Ray (`[rank r] ` lines). The run file (JSON, on the folder the daemon and the cluster share) names the job
(its spec and log paths, read by the runners), the ranks, the hosts they span and each one's bundle.

Stopping: Ray's `stop_job` SIGTERMs this driver; it SIGTERMs every rank, which stop at a checkpoint as a local child
does (the ranks agree on the step), and exits once they have: 75 when they stopped at one. A rank that dies (a lost
node, a killed process) ends the job: the others are killed and the driver exits 1, naming the rank, so the daemon
retries it from its newest checkpoint. Run where the cluster runs; imports Ray, never the daemon.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

MARKER = "@@adapterd"
EXIT_STOPPED = 75  # handlers/toolkit/reporting.py's: the ranks stopped at a checkpoint when asked
EXIT_UNPLACED = 3  # the cluster had no room for the job's ranks within the placement timeout


def rank_environment(
    rank: int, world: int, local_rank: int, local_world: int, master: str, port: int
) -> dict[str, str]:
    """What torchrun gives each worker (torch/distributed/run.py), which accelerate and the runner read."""
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": "0",
        "MASTER_ADDR": master,
        "MASTER_PORT": str(port),
        # torchrun's default: Ray would otherwise set the actor's CPU count, and the ranks' arithmetic with it.
        "OMP_NUM_THREADS": "1",
        "ADAPTERD_RAY": "1",  # the runner reports on ADAPTERD_STATUS_FD itself (handlers/child/runner.py)
    }


def placement(
    workers: int, hosts: int, bundle: dict[str, float], strategy: str
) -> tuple[list[dict[str, float]], str, list[int]]:
    """The placement group's bundles and strategy, and each rank's bundle: one bundle per rank, placed as the
    operator's `strategy` says; for a job across `hosts` (resources.hosts), one bundle per host holding its
    workers / hosts ranks' resources, each on a node of its own (STRICT_SPREAD: Ray's guarantee, not ours)."""
    if hosts <= 1:
        return [bundle] * workers, strategy, list(range(workers))
    each = workers // hosts  # the request's check: gpus a multiple of hosts (schemas/request_base.py)
    return (
        [{name: amount * each for name, amount in bundle.items()}] * hosts,
        "STRICT_SPREAD",
        [rank // each for rank in range(workers)],
    )


class RankProcess:
    """One rank's runner, in the actor that placed it: started, its output forwarded with its rank's mark, its
    status lines (rank 0's) kept for the driver to read in order, signalled, awaited."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.process: subprocess.Popen[bytes] | None = None
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.ended = False
        self.asked = False  # a signal was sent to it from here (a stop, or the end of a job another rank ended)

    def start(self, env: dict[str, str]) -> None:
        read_fd, write_fd = os.pipe()
        child_env = {**os.environ, **env, "ADAPTERD_STATUS_FD": str(write_fd), "PYTHONUNBUFFERED": "1"}
        child_env["ADAPTERD_PARENT_PID"] = str(os.getpid())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "handlers.child.runner"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env,
            pass_fds=(write_fd,),
            start_new_session=True,  # a signal reaches everything the trainer started
        )
        os.close(write_fd)
        threading.Thread(target=self._status, args=(read_fd,), daemon=True).start()
        threading.Thread(target=self._output, daemon=True).start()

    def _status(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for line in pipe:
                with self.changed:
                    self.lines.append(line.decode(errors="replace").rstrip("\n"))
                    self.changed.notify_all()
        with self.changed:
            self.ended = True
            self.changed.notify_all()

    def _output(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            print(f"[rank {self.rank}] {line.decode(errors='replace').rstrip()}", flush=True)

    def read(self, after: int, wait_s: float) -> tuple[list[str], bool]:
        """The status lines after the first `after`, waiting up to `wait_s` for one; and whether the pipe ended."""
        with self.changed:
            self.changed.wait_for(lambda: len(self.lines) > after or self.ended, timeout=wait_s)
            return self.lines[after:], self.ended and len(self.lines) >= after

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.asked = True
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                pass

    def wait(self) -> int:
        assert self.process is not None
        code = self.process.wait()
        self.signal(signal.SIGKILL)  # whatever the trainer started and left behind
        return code


class RankWorker:
    """One rank's place on the cluster (a Ray actor, `main`): where it is, and its runner (`RankProcess`). Its calls
    run on threads of their own (max_concurrency), so `read` and `signal` reach it while `run` waits."""

    def __init__(self, rank: int) -> None:
        self.rank = RankProcess(rank)

    def where(self) -> tuple[str, str, list[str]]:
        import ray

        node = ray.get_runtime_context().get_node_id()
        return node, ray.util.get_node_ip_address(), [str(gpu) for gpu in ray.get_gpu_ids()]

    def port(self) -> int:
        return free_port()

    def run(self, env: dict[str, str]) -> tuple[int, bool]:
        """The runner's exit status, and whether a signal was asked of it before it ended (else a signal that ended
        it came from elsewhere: a lost node, the out-of-memory killer, an operator)."""
        self.rank.start(env)
        code = self.rank.wait()
        return code, self.rank.asked

    def read(self, after: int) -> tuple[list[str], bool]:
        return self.rank.read(after, 1.0)

    def signal(self, sig: int) -> None:
        self.rank.signal(sig)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


def main() -> int:
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    run = json.loads(open(sys.argv[1]).read())
    workers, hosts, bundle = int(run["workers"]), int(run.get("hosts", 1)), dict(run["bundle"])
    ray.init(log_to_driver=True)

    bundles, strategy, bundle_of = placement(workers, hosts, bundle, run.get("strategy", "PACK"))
    group = placement_group(bundles, strategy=strategy)
    if not group.wait(float(run.get("placement_timeout_s", 900))):
        across = f" across {hosts} nodes" if hosts > 1 else ""
        print(
            f"adapterd ray job: the cluster had no room for {workers} ranks of {bundle}{across} "
            f"within {run.get('placement_timeout_s')} s",
            flush=True,
        )
        return EXIT_UNPLACED
    # Ray's stubs know no actor options on `remote`: the decorator is called untyped.
    remote: Any = ray.remote
    actor: Any = remote(max_concurrency=4, max_restarts=0)(RankWorker)
    ranks = [
        actor.options(
            num_cpus=bundle.get("CPU", 0),
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=bundle_of[i]),
        ).remote(i)
        for i in range(workers)
    ]
    places = ray.get([rank.where.remote() for rank in ranks])
    master, port = places[0][1], ray.get(ranks[0].port.remote())
    # Local ranks in bundle order on each node; every rank sees its node's GPUs of the job in that order.
    env = []
    for i, (node, _, _) in enumerate(places):
        on_node = [j for j, place in enumerate(places) if place[0] == node]
        devices = sorted({gpu for j in on_node for gpu in places[j][2]})
        each = rank_environment(i, workers, on_node.index(i), len(on_node), master, port)
        each["ADAPTERD_JOB"] = json.dumps(run["job"])
        if devices:
            each["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        env.append(each)
    print(f"adapterd ray job: {workers} ranks on {len({p[0] for p in places})} node(s), master {master}:{port}")

    stopping = threading.Event()

    def stop(signum: int, frame: object) -> None:
        # Ray's stop_job: every rank stops at a checkpoint (they agree on the step), as a local job's do.
        stopping.set()
        for rank in ranks:
            rank.signal.remote(signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    running = {rank.run.remote(each): i for i, (rank, each) in enumerate(zip(ranks, env, strict=True))}
    relay = Relay(ray, ranks[0])
    thread = threading.Thread(target=relay.run, daemon=True)
    thread.start()
    codes, lost = _await_ranks(ray, ranks, running)
    thread.join(timeout=30)  # rank 0's last lines (its result, or the checkpoint it stopped at)
    failed = {i: code for i, code in codes.items() if code not in (0, EXIT_STOPPED)}
    if lost:
        # A rank that died from outside (its node lost, killed): the others' errors are its consequence (a peer gone
        # from a collective), so the job says it crashed, retryable, whatever rank 0 said before.
        relay.say_crashed(f"the Ray job's {'; '.join(lost)}")
    if failed:
        print(f"adapterd ray job: rank(s) ended: {_describe(failed)}", flush=True)
        return 1
    return EXIT_STOPPED if stopping.is_set() or EXIT_STOPPED in codes.values() else 0


class Relay:
    """Rank 0's status lines, as marker lines on the driver's stdout (the Ray job's log), to its pipe's end; and the
    driver's own word, numbered after them, when a rank was lost."""

    def __init__(self, ray: Any, rank0: Any) -> None:
        self.ray = ray
        self.rank0 = rank0
        self.seen = 0
        self.stage = "preflight"

    def run(self) -> None:
        ended = False
        while not ended:
            lines, ended = self.ray.get(self.rank0.read.remote(self.seen))
            for line in lines:
                self.print(line)
                try:
                    said = json.loads(line)
                except ValueError:
                    continue
                if isinstance(said, dict) and said.get("kind") == "stage":
                    self.stage = str(said.get("stage"))

    def print(self, line: str) -> None:
        self.seen += 1
        print(f"{MARKER} {self.seen} {line}", flush=True)

    def say_crashed(self, why: str) -> None:
        error = {"kind": "error", "code": "child_crashed", "stage": self.stage, "message": why, "retryable": True}
        self.print(json.dumps(error))


def _await_ranks(ray: Any, ranks: list[Any], running: dict[Any, int]) -> tuple[dict[int, int], list[str]]:
    """Every rank's exit status, and the ranks lost from outside (a signal this driver did not send, an actor gone with
    its node). The first rank to fail ends the others at once, as torchrun's agent does, rather than leave them
    blocked in a collective."""
    codes: dict[int, int] = {}
    lost: list[str] = []
    pending = list(running)
    while pending:
        # A bounded wait: the driver's SIGTERM handler (a stop) runs between two, in the main thread.
        done, pending = ray.wait(pending, num_returns=1, timeout=1.0)
        if not done:
            continue
        i = running[done[0]]
        try:
            codes[i], asked = ray.get(done[0])
            if codes[i] < 0 and not asked:
                lost.append(f"rank {i} was {_ending(codes[i])}")
        except Exception as exc:  # the actor died with its node or its process
            lost.append(f"rank {i} was lost: {type(exc).__name__}: {str(exc)[:300]}")
            codes[i] = -int(signal.SIGKILL)
        if codes[i] not in (0, EXIT_STOPPED):
            for rank in ranks:
                rank.signal.remote(signal.SIGKILL)
    return codes, lost


def _ending(code: int) -> str:
    return f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"


def _describe(failed: dict[int, int]) -> str:
    return ", ".join(f"rank {i} {_ending(code)}" for i, code in sorted(failed.items()))


if __name__ == "__main__":
    sys.exit(main())
