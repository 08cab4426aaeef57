"""Children that run on the operator's Ray cluster: a job bigger than this host, one Ray job per run.

`RayChildSource` is a `ChildSource` (daemon/children/processes.py) and `RayRun` the handle on one run, so a job on
Ray is supervised, stopped, retried and published exactly as a local one. The job's folder is on the folder the
cluster shares with this host (`ray.shared_dir`): the source writes the spec and a run file there, and submits
`handlers.child.ray_job` (the driver, which places the ranks and runs today's child runner on each) through Ray's
Jobs API. Rank 0's messages come back as marker lines in the Ray job's log, read with `tail_job_logs`; every other
line of that log is the job's `child.log`, which `adapterd logs` serves.

Submission is idempotent: a run's Ray id is derived from the request and its attempt (`adapterd-<id>-a<attempt>`,
then `-r2`, `-r3`... after runs that were stopped at a checkpoint), so a daemon restarted mid-job, or the host a
rebalance gives the request to, finds the run in Ray and follows it instead of submitting again: one training, one
Hub commit. A run already there is read from its log's start; what it said before is passed on only as far as the
supervisor needs it (its stage, its last checkpoint, its end), never as stale progress.

The Ray client (`ray.job_submission`, the `ray` extra) is imported only when a job goes to Ray, and its blocking
calls run in the `ray` pool (daemon/executors.py). A cluster that does not answer makes `start` raise
`EngineUnreachable`: the job waits and says so (daemon/job/supervisor.py), it is not failed for an outage.
"""

from __future__ import annotations

import asyncio
import json
import shlex
import shutil
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
from pydantic import ValidationError

from daemon import executors
from daemon.children.child import ChildExit, ChildJob, ChildPlace, read_tail, write_job
from daemon.children.environment import NAMES
from daemon.errors import EngineUnreachable
from daemon.ops.job_logs import LOG_NAME
from daemon.settings.ray import RaySettings
from handlers.protocol import (
    CheckpointSaved,
    ChildError,
    ChildMessage,
    FirstStep,
    Ready,
    StageEntered,
    StoppedAtCheckpoint,
    TrainResult,
    parse_child_message,
)

log = structlog.get_logger()

MARKER = "@@adapterd "  # handlers/child/ray_job.py's: rank 0's messages in the Ray job's log
DRIVER = "handlers.child.ray_job"  # the Ray job's entrypoint module, on the cluster's nodes
RUN_NAME = "ray-run.json"  # in the job's folder: what the driver places and runs
EXIT_STOPPED = 75
# A run's ends: Ray's, and LOST, a run Ray no longer knows (its head restarted without its state).
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED", "LOST"}
# What a run already there said before this daemon followed it, passed on: what the supervisor keeps of a run (its
# stage, its first step, its end), never its old progress; of its checkpoints only the last (`_caught_up`).
KEPT_ON_CATCH_UP = (Ready, StageEntered, FirstStep, StoppedAtCheckpoint, TrainResult, ChildError)


def run_id(request_id: str, attempt: int, run: int) -> str:
    """A run's Ray submission id: the same on every host and after every restart, for the same attempt."""
    base = f"adapterd-{request_id}-a{attempt}"
    return base if run == 1 else f"{base}-r{run}"


def ray_environment(env: Mapping[str, str], settings: RaySettings, stop_grace_s: float) -> dict[str, str]:
    """What a Ray job's ranks see of the daemon's child environment: the training stack's settings, never this host's
    own process basics (its PATH, HOME, virtual environment: a node has its own), nor the Hub token unless the
    operator passes it (`pass_hub_token`: the Jobs API shows a job's runtime_env to whoever can read it)."""
    passed = {name: value for name, value in env.items() if name not in NAMES}
    if not settings.pass_hub_token:
        passed.pop("HF_TOKEN", None)
    passed["RAY_DEDUP_LOGS"] = "0"  # every rank's lines, not folded into "repeated N times"
    passed["RAY_COLOR_PREFIX"] = "0"  # the ranks' lines in the log without terminal colours
    passed["RAY_JOB_STOP_WAIT_TIME_S"] = str(int(stop_grace_s))  # how long a stop lets the ranks save
    return passed


def status_of(details: Any) -> str:
    """A JobDetails' status as its name ("RUNNING"): Ray gives a JobStatus enum, a fake may give the string."""
    return str(getattr(details.status, "value", details.status))


def unreachable(exc: BaseException) -> bool:
    """Whether a failed call means the cluster did not answer (it is waited for) rather than refused (a fault)."""
    return isinstance(exc, OSError)  # requests' and Ray's connection errors are OSErrors


class RayChildSource:
    """Where a job bigger than this host gets its child: a run on the Ray cluster (`start`, idempotent per attempt)."""

    def __init__(self, settings: RaySettings, env: Mapping[str, str], stop_grace_s: float, client: Any = None) -> None:
        self.settings = settings
        self.env = ray_environment(env, settings, stop_grace_s)
        self._client = client  # ray.job_submission.JobSubmissionClient, made at the first job (`_connect`)

    async def prepare(self, wanted: list[str | None]) -> None:
        return None  # nothing to start ahead: the cluster starts each run's processes

    async def close(self) -> None:
        return None  # runs are the cluster's: a daemon going down stops its jobs through their handles, not here

    async def _connect(self) -> Any:
        if self._client is None:
            self._client = await self._answered(_client_for, self.settings.address)
        return self._client

    async def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        client = await self._connect()
        return await self._answered(getattr(client, name), *args, **kwargs)

    async def _answered(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A blocking call of the Ray client, in the `ray` pool; EngineUnreachable when the cluster does not answer."""
        try:
            return await executors.run("ray", call, *args, **kwargs)
        except Exception as exc:
            if unreachable(exc):
                raise EngineUnreachable(f"the Ray cluster at {self.settings.address} does not answer: {exc}") from exc
            raise

    async def info(self, submission_id: str) -> Any | None:
        """The run's JobDetails, or None when Ray has no such job."""
        try:
            return await self._call("get_job_info", submission_id)
        except RuntimeError as exc:  # the Jobs API's answer to an unknown id: "... does not exist" (404)
            if "does not exist" in str(exc) or "404" in str(exc):
                return None
            raise

    async def start(self, job: ChildJob) -> RayRun:
        """The job's run on the cluster: the first of its attempt's runs that is not over for good, followed; or a new
        one, submitted. Raises EngineUnreachable while the cluster does not answer."""
        folder = job.spec.artifact.parent
        for number in range(1, 1000):
            sid = run_id(job.request_id, job.attempt, number)
            details = await self.info(sid)
            if details is None:
                return await self._submit(job, sid, folder)
            status = status_of(details)
            if status == "STOPPED":
                continue  # stopped at a checkpoint (a pause, a preemption, a daemon's stop): the next run resumes
            if status == "SUCCEEDED" and not job.spec.artifact.is_dir():
                continue  # its artifact is gone from the shared folder: trained again from its last checkpoint
            log.info("ray.attached", request_id=job.request_id, submission_id=sid, status=status)
            return await RayRun.attached(self, sid, folder / LOG_NAME)
        raise RuntimeError(f"{job.request_id}: a thousand runs of attempt {job.attempt} on Ray")

    async def _stop_earlier(self, job: ChildJob, sid: str) -> None:
        """One run of a request at a time: an earlier run still going (a stall's stop that did not reach the cluster, a
        host that lost the request while its run went on) is stopped, and awaited, before a new one is submitted."""
        going = [
            each.submission_id
            for each in await self._call("list_jobs")
            if (each.metadata or {}).get("adapterd_request_id") == job.request_id
            and each.submission_id != sid
            and status_of(each) not in TERMINAL
        ]
        for earlier in going:
            log.warning("ray.earlier_run_stopped", request_id=job.request_id, submission_id=earlier, new=sid)
            await self._call("stop_job", earlier)
        deadline = time.monotonic() + float(self.env["RAY_JOB_STOP_WAIT_TIME_S"]) + 60
        while going and time.monotonic() < deadline:
            details = [await self.info(earlier) for earlier in going]
            going = [
                earlier
                for earlier, each in zip(going, details, strict=True)
                if each is not None and status_of(each) not in TERMINAL
            ]
            if going:
                await asyncio.sleep(min(1.0, self.settings.retry_s))  # Ray's word on a job's end is asked, not told

    async def _submit(self, job: ChildJob, sid: str, folder: Path) -> RayRun:
        await self._stop_earlier(job, sid)
        shutil.rmtree(job.spec.artifact, ignore_errors=True)  # a half-written artifact of an earlier run
        given = write_job(job, folder)
        run_file = folder / RUN_NAME
        run_file.write_text(
            json.dumps(
                {
                    "job": {"spec": str(given.spec_path), "log": str(given.log_path)},
                    "workers": job.gpus,
                    "hosts": job.hosts,
                    "bundle": self.settings.worker_resources,
                    "strategy": self.settings.placement_strategy,
                    "placement_timeout_s": self.settings.placement_timeout_s,
                }
            )
        )
        runtime_env = dict(self.settings.runtime_env)
        extra = runtime_env.get("env_vars")
        runtime_env["env_vars"] = {**self.env, **(extra if isinstance(extra, dict) else {})}
        try:
            await self._call(
                "submit_job",
                entrypoint=f"exec {shlex.quote(self.settings.python)} -m {DRIVER} {shlex.quote(str(run_file))}",
                submission_id=sid,
                runtime_env=runtime_env,
                metadata={"adapterd_request_id": job.request_id, "adapterd_attempt": str(job.attempt)},
            )
        except RuntimeError as exc:
            if "already exists" not in str(exc):
                raise
            log.info("ray.submitted_elsewhere", request_id=job.request_id, submission_id=sid)  # a peer won the race
            return await RayRun.attached(self, sid, given.log_path)
        log.info("ray.submitted", request_id=job.request_id, submission_id=sid, workers=job.gpus)
        given.log_path.write_text("")
        return RayRun(self, sid, given.log_path)


def _client_for(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient  # the `ray` extra: only a host with a Ray cluster imports it

    return JobSubmissionClient(address)


class RayRun:
    """One run on the cluster, as its supervisor follows it (a `ChildHandle`): its messages from its log, a stop
    through Ray, how it ended from Ray's word for it."""

    def __init__(self, source: RayChildSource, sid: str, log_path: Path, consumed: int = 0, seen: int = 0) -> None:
        self.source = source
        self.sid = sid
        self.log_path = log_path
        self._said: asyncio.Queue[ChildMessage | None] = asyncio.Queue()
        self._consumed = consumed  # characters of the log read (before this daemon attached: `attached`)
        self._seen = seen  # the last marker's sequence number passed on
        self.stopped = False  # the run said it stopped at a checkpoint
        self.status: str | None = None
        self.exit_code: int | None = None
        self._tail = asyncio.create_task(self._follow(), name=f"ray-tail-{sid}")

    @classmethod
    async def attached(cls, source: RayChildSource, sid: str, log_path: Path) -> RayRun:
        """A run already on the cluster (this daemon restarted, or took the request over): its log so far read once,
        its lines rewritten as the job's log, and of its messages what the supervisor keeps (`KEPT_ON_CATCH_UP`)."""
        text = str(await source._call("get_job_logs", sid))
        lines, messages, seen = _split(text.splitlines())
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text("".join(line + "\n" for line in lines))
        run = cls(source, sid, log_path, consumed=len(text), seen=seen)
        for message in _caught_up(messages):
            run._pass(message)
        return run

    @property
    def place(self) -> ChildPlace:
        return ChildPlace(f"ray job {self.sid}", None, f"{self.source.settings.address}/api/jobs/{self.sid}/logs")

    def _pass(self, message: ChildMessage) -> None:
        if isinstance(message, StoppedAtCheckpoint):
            self.stopped = True
        self._said.put_nowait(message)

    async def _follow(self) -> None:
        """The run's log to its end: marker lines passed on in order (each once), the rest into the job's log. A tail
        that ends while Ray says the run goes on (a dropped connection) is taken up again where it was."""
        pending = ""
        delay = min(1.0, self.source.settings.retry_s)
        try:
            while True:
                read = 0
                try:
                    client = await self.source._connect()
                    async for chunk in client.tail_job_logs(self.sid):  # from the log's start, each time
                        text = str(chunk)
                        start, read = read, read + len(text)
                        if read <= self._consumed:
                            continue
                        text, self._consumed = text[max(0, self._consumed - start) :], read
                        pending += text
                        *complete, pending = pending.split("\n")
                        self._take(complete)
                except Exception as exc:
                    log.warning("ray.tail_broken", submission_id=self.sid, error=repr(exc))
                details = await self._details()
                if details is not None and details[0] in TERMINAL:
                    # What the tail did not get to (it broke, and the run ended meanwhile): the log's rest, read once.
                    *complete, last = (pending + await self._rest()).split("\n")
                    self._take([*complete, last] if last else complete)
                    self.status, self.exit_code = details
                    return
                await asyncio.sleep(delay)  # the cluster or its dashboard away for a moment: asked again, backing off
                delay = min(delay * 2, self.source.settings.retry_s)
        finally:
            self._said.put_nowait(None)

    async def _rest(self) -> str:
        try:
            text = str(await self.source._call("get_job_logs", self.sid))
        except Exception as exc:
            log.warning("ray.log_unread", submission_id=self.sid, error=repr(exc))
            return ""
        rest, self._consumed = text[self._consumed :], max(self._consumed, len(text))
        return rest

    async def _details(self) -> tuple[str, int | None] | None:
        try:
            details = await self.source.info(self.sid)
        except Exception as exc:
            log.warning("ray.unanswered", submission_id=self.sid, error=repr(exc))
            return None
        if details is None:
            return ("LOST", None)  # the cluster lost it (a head restarted without its state): over, as a crash
        status = status_of(details)
        return status, getattr(details, "driver_exit_code", None)

    def _take(self, lines: list[str]) -> None:
        plain, messages, seen = _split(lines, after=self._seen)
        self._seen = max(self._seen, seen)
        if plain:
            with open(self.log_path, "a") as out:
                out.write("".join(line + "\n" for line in plain))
        for message in messages:
            self._pass(message)

    def messages(self) -> AsyncIterator[ChildMessage]:
        return self

    def __aiter__(self) -> RayRun:
        return self

    async def __anext__(self) -> ChildMessage:
        message = await self._said.get()  # a cancelled get takes nothing off the queue
        if message is None:
            self._said.put_nowait(None)  # the end stays the end for a later reader (a stop's drain)
            raise StopAsyncIteration
        return message

    async def stop(self, grace_s: float) -> None:
        """Ray's stop_job: its driver SIGTERMs every rank, which save a checkpoint (within RAY_JOB_STOP_WAIT_TIME_S,
        after which Ray kills them); returns once Ray says the run is over and its log is read. A cancel (grace 0)
        is the same call: the Jobs API has no other stop."""
        try:
            await self.source._call("stop_job", self.sid)
        except Exception as exc:
            log.warning("ray.stop_failed", submission_id=self.sid, error=repr(exc))
        limit = float(self.source.env.get("RAY_JOB_STOP_WAIT_TIME_S", "30")) + 60
        try:
            await asyncio.wait_for(asyncio.shield(self._tail), limit)
        except TimeoutError:
            log.warning("ray.stop_unconfirmed", submission_id=self.sid, waited_s=limit)

    async def wait(self) -> ChildExit:
        await asyncio.shield(self._tail)
        tail = read_tail(self.log_path)
        status = self.status
        if status == "SUCCEEDED":
            return ChildExit(0, tail)
        if status == "STOPPED":
            return ChildExit(EXIT_STOPPED if self.stopped else -15, tail)
        if status == "LOST":
            return ChildExit(-9, [*tail, f"the Ray cluster lost job {self.sid}"])
        return ChildExit(self.exit_code if self.exit_code else 1, tail)


def _split(lines: list[str], after: int = 0) -> tuple[list[str], list[ChildMessage], int]:
    """A stretch of the Ray job's log: its plain lines, its messages numbered above `after`, the last number seen."""
    plain: list[str] = []
    messages: list[ChildMessage] = []
    seen = after
    for line in lines:
        if not line.startswith(MARKER):
            plain.append(line)
            continue
        number, _, body = line[len(MARKER) :].partition(" ")
        try:
            sequence = int(number)
            if sequence <= seen:
                continue
            messages.append(parse_child_message(body.encode()))
            seen = sequence
        except (ValueError, ValidationError) as exc:
            log.warning("ray.bad_message", line=line[:200], error=str(exc))
    return plain, messages, seen


def _caught_up(messages: list[ChildMessage]) -> list[ChildMessage]:
    last = max((i for i, m in enumerate(messages) if isinstance(m, CheckpointSaved)), default=None)
    return [m for i, m in enumerate(messages) if isinstance(m, KEPT_ON_CATCH_UP) or i == last]
