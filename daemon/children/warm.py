"""Children whose imports are done before their job: forked from a fork server (the default), or
started ahead, one per free slot (`child_start = "spawn"`).

A warm start has already spent the seconds of importing torch, transformers and TRL when a request
arrives; CUDA stays untouched until the job. Every job still gets a process of its own that exits
after it.
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Literal

import structlog

from daemon.children.child import Child, ChildJob, LocalJob, write_job
from daemon.children.environment import passed_on
from daemon.children.forkserver import ForkServer
from daemon.ops import metrics
from daemon.settings import Settings

log = structlog.get_logger()

# A fork server that dies this many times in a row after saying ready, none of its forks answered,
# is not started again: its children start spawned ahead instead (a restart loop would import the
# training stack again and again for nothing).
MOST_FORKSERVER_DEATHS = 3


def child_environment(settings: Settings) -> dict[str, str]:
    """What every child sees: of the daemon's environment only what daemon/children/environment.py
    allows, the Hub endpoint and the daemon's token (never a request's), the operator's experiment
    tracker, quiet logs."""
    env = passed_on(os.environ, settings)
    env["HF_ENDPOINT"] = settings.hub_endpoint
    env.pop("HF_TOKEN", None)
    if settings.hub_token is not None:
        env["HF_TOKEN"] = settings.hub_token.get_secret_value()
    # The child's own logs go to a file: keep them free of progress bars.
    env.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    # A job whose model and data are local makes no Hub call: without this, TRL reports each trainer it
    # builds to the Hub (/api/telemetry/trl/SFTTrainer) and huggingface_hub fetches its agent registry
    # (/api/agent-harnesses) for its user agent. The operator may set it to 0 to allow them.
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    # transformers (5.25 on, with `kernels`) fetches kernels for a model's layers from the Hub by default: code from
    # the Hub, run in the job. Only where the operator says so: `child_env = ["USE_HUB_KERNELS"]` with it set to YES in
    # the daemon's environment (handlers/toolkit/deferred.py `hub_kernels_withheld` reads it too, for bitsandbytes).
    env.setdefault("USE_HUB_KERNELS", "NO")
    if settings.mlflow_tracking_uri is not None:  # the operator's tracker, never a request's
        env["MLFLOW_TRACKING_URI"] = settings.mlflow_tracking_uri
        env["MLFLOW_EXPERIMENT_NAME"] = settings.mlflow_experiment
    # Trackio logs to the operator's folder only. Its Space, server and bucket variables go: each would
    # send the metrics off the host (a Space and a bucket are created under the daemon's Hub token,
    # outside allowed_output_namespaces). trackio reads TRACKIO_DIR when it is imported, which the
    # fork server does ahead of any job (TRL imports it), so it is set here, not in the child.
    for variable in ("TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL", "TRACKIO_REGISTRY_BUCKET_ID", "TRACKIO_WRITE_TOKEN"):
        env.pop(variable, None)
    if settings.trackio_dir is not None:
        env["TRACKIO_DIR"] = str(settings.trackio_dir)
    return env


def became_ready(ready_task: asyncio.Task[bool]) -> bool:
    """Whether a child's (or the fork server's) finished readiness task says it got ready."""
    return not ready_task.cancelled() and ready_task.result()


def log_readiness(ready: str, died: str, pid: int, ready_task: asyncio.Task[bool]) -> None:
    """A readiness task's done callback: log `ready` or `died` for the process."""
    log.info(ready if became_ready(ready_task) else died, pid=pid)


class WarmChildren:
    """Where a job's child comes from (`start`), on this host: its spec written into the job's folder under
    `jobs_dir` (`spec.json`, its output to `child.log` beside it); for a job of several GPUs, torchrun's launcher
    started for it alone; for a one-GPU job, a child whose imports were done ahead of the job:

    - `fork` (the default): one fork server for the host, started ahead; every job's child is forked
      from it, so every start is warm, back-to-back jobs on a slot included. A fresh server is
      started if it dies; until it is ready, a job gets a cold child.
    - `spawn`: one child interpreter started ahead per free slot and replaced after its job, so only
      a slot's first job after a pause is warm.

    A fork server that refuses to serve (it found CUDA touched or another thread running in itself:
    handlers/child/forkserver.py), or that dies `MOST_FORKSERVER_DEATHS` times in a row, is not started
    again: the daemon says so once (`forkserver.refused`, `forkserver.given_up`, and the
    adapterd_forkserver_failures_total metric) and goes on in `spawn` mode.

    CUDA reads CUDA_VISIBLE_DEVICES once, when a process first touches CUDA, so each child gets its
    slot's devices in its environment before its job starts.
    """

    def __init__(
        self,
        env: Mapping[str, str],
        log_path: Path,
        jobs_dir: Path,
        enabled: bool,
        mode: Literal["fork", "spawn"] = "fork",
    ) -> None:
        self.env = env
        self.log_path = log_path  # the output of children not yet given a job, and of the fork server
        self.jobs_dir = jobs_dir.absolute()  # a job's folder is <it>/<request id>, where its child runs
        self.enabled = enabled
        self.mode = mode
        self.server: ForkServer | None = None
        self._ready: list[tuple[str | None, Child]] = []  # spawn: (CUDA_VISIBLE_DEVICES, child)
        self._deaths = 0  # fork servers in a row that died after saying ready, with no fork answered since
        self.fallen_back: str | None = None  # why the fork server was given up, once it was
        self._show_mode()

    def _show_mode(self) -> None:
        mode = self.mode if self.enabled else "cold"
        for each in ("fork", "spawn", "cold"):
            metrics.WARM_START.labels(each).set(1 if each == mode else 0)

    def _fall_back(self, event: str, **why: object) -> None:
        """Stop using a fork server: children are started ahead per slot from now on."""
        log.error(event, fallback="spawn", **why)
        self.mode = "spawn"
        self.fallen_back = f"{event}: " + ", ".join(f"{key} {value}" for key, value in why.items())
        self._show_mode()

    def describe(self) -> dict[str, object]:
        """How children start now, for /status: the mode in force, the fork server's state, and why
        it fell back to spawning when it did."""
        mode = self.mode if self.enabled else "cold"
        server = None
        if self.server is not None:
            ready = self.server.server.ready_task
            server = ("ready" if ready.result() else "exited") if ready.done() and not ready.cancelled() else "starting"
        return {"mode": mode, "fork_server": server, "fell_back": self.fallen_back}

    def environment(self, visible_devices: str | None) -> dict[str, str]:
        env = dict(self.env)
        if visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices
        return env

    async def prepare(self, wanted: list[str | None]) -> None:
        """Be ready for the next jobs: a live fork server, or (spawn) one live warm child per entry of
        `wanted` (the devices of each free slot)."""
        if not self.enabled:
            return
        if self.mode == "fork" and (self.server is None or not self.server.alive):
            if self.server is not None:
                await self._gone(self.server)
                self.server = None
            if self.mode == "fork":
                self.server = await ForkServer.start(self.env, self.log_path)
                self.server.server.ready_task.add_done_callback(
                    functools.partial(
                        log_readiness, "forkserver.ready", "forkserver.died", self.server.server.process.pid
                    )
                )
        if self.mode == "fork":
            return
        self._ready = [(devices, child) for devices, child in self._ready if child.process.returncode is None]
        missing = list(wanted)
        for devices, _ in self._ready:
            if devices in missing:
                missing.remove(devices)
        for devices in missing:
            child = await Child.spawn(self.environment(devices), self.log_path)
            self._ready.append((devices, child))
            log.info("child.warming", pid=child.process.pid, visible_devices=devices)
            child.ready_task.add_done_callback(
                functools.partial(log_readiness, "child.warm_ready", "child.warm_died", child.process.pid)
            )

    async def _gone(self, server: ForkServer) -> None:
        """A fork server that is no longer alive: say how it ended, and fall back when it refused or keeps dying."""
        await server.close()
        child = server.server
        if child.refusal is not None:
            metrics.FORKSERVER_FAILURES.labels("refused").inc()
            self._fall_back("forkserver.refused", pid=child.process.pid, reason=child.refusal)
            return
        if not (child.ready_task.done() and became_ready(child.ready_task)):
            return  # it died before it was ready: the readiness callback said so, once
        # One that died after it was ready (the out-of-memory killer, say; or at a fork).
        log.warning("forkserver.died", pid=child.process.pid, returncode=child.process.returncode)
        metrics.FORKSERVER_FAILURES.labels("died").inc()
        self._deaths += 1
        if self._deaths >= MOST_FORKSERVER_DEATHS:
            self._fall_back("forkserver.given_up", deaths=self._deaths)

    async def start(self, job: ChildJob) -> Child:
        """The job's child, given its job: torchrun's launcher for a job of several GPUs (`_launch`), else one process
        (`_take`)."""
        given = write_job(job, self.jobs_dir / job.request_id)
        child = await (self._launch(job, given) if job.gpus > 1 else self._take(job.visible_devices))
        await child.begin(given, job.request_id)
        return child

    async def _take(self, visible_devices: str | None) -> Child:
        """A child for one job on these devices: forked, or a live warm one (ready or still importing),
        else a new cold one."""
        if self.server is not None and self.server.alive:
            try:
                child = await self.server.fork(
                    {"CUDA_VISIBLE_DEVICES": visible_devices} if visible_devices is not None else {}, self.log_path
                )
                self._deaths = 0  # it answered a fork
                return child
            except ConnectionError as exc:
                log.warning("forkserver.fork_failed", error=str(exc))
        for entry in self._ready:
            devices, child = entry
            if devices == visible_devices and child.process.returncode is None:
                self._ready.remove(entry)
                return child
        return await Child.spawn(self.environment(visible_devices), self.log_path)

    async def _launch(self, job: ChildJob, given: LocalJob) -> Child:
        """A multi-GPU job's child (data-parallel, or sharded as `resources.shard` asks): torchrun's agent, which starts
        one worker per GPU (handlers/child/launch.py).
        Started for this job, never forked: the workers set up their devices and process group themselves. The
        job (its spec and log) goes in the environment, as torchrun passes it on to every worker."""
        return await Child.spawn(
            {**self.environment(job.visible_devices), "ADAPTERD_JOB": given.line()},
            given.log_path,
            entry=("handlers.child.launch", str(job.gpus)),
        )

    async def close(self) -> None:
        """Stop the fork server and every child waiting for a job."""
        await asyncio.gather(*(child.stop(grace_s=2.0) for _, child in self._ready))
        self._ready = []
        if self.server is not None:
            await self.server.close()
            self.server = None
