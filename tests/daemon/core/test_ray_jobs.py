"""A job bigger than the host, run on a Ray cluster through its Jobs API (daemon/children/ray_jobs.py), against an
in-memory Jobs API (`FakeJobs`: the calls of ray.job_submission.JobSubmissionClient the source makes, with Ray's
answers: a 404 as RuntimeError "does not exist", a duplicate id as "already exists", a log tailed from its start).
The submission is idempotent per attempt, a run already there is followed rather than submitted again, and what it
said before is passed on only as far as the supervisor keeps it. The scheduler sends such a request there, leaving
the host's own slots to its jobs, and a cluster that does not answer makes the job wait, saying so. Milliseconds
each; the real cluster: tests/daemon/e2e/test_ray_e2e.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from daemon.children.child import ChildJob
from daemon.children.ray_jobs import RUN_NAME, RayChildSource, run_id
from daemon.errors import EngineUnreachable
from daemon.jobs.offered import Offered
from daemon.settings import Settings
from daemon.settings.ray import RaySettings
from handlers.protocol import (
    CheckpointSaved,
    FirstStep,
    JobSpec,
    ProgressReport,
    StageEntered,
    StoppedAtCheckpoint,
)
from schemas import Rejection
from tests.core import CoreOnFakes, turns_until
from tests.daemon.core.test_scheduler_core import SUCCEEDS
from tests.fakes import FakeChildren, Script
from tests.helpers import TRAIN_RESULT as RESULT
from tests.helpers import sft_request


@dataclass
class Details:
    status: str
    driver_exit_code: int | None = None
    submission_id: str = ""
    metadata: dict[str, str] | None = None


class FakeJobs:
    """The Jobs API of a cluster, in memory: jobs by submission id, each with a status and a log."""

    def __init__(self) -> None:
        self.jobs: dict[str, Details] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.logs: dict[str, str] = {}
        self.submitted: list[dict[str, Any]] = []
        self.stopped: list[str] = []
        self.tails = 0
        self.break_tail_after: int | None = None  # chunks, on the first tail: a dropped connection
        self.retailed = asyncio.Event()  # a second tail began
        self.on_break: Callable[[], None] = lambda: None  # what happens as the tail drops
        self.reachable = True
        self.chunk = asyncio.Event()

    def get_job_info(self, sid: str) -> Details:
        if not self.reachable:
            raise ConnectionError("Failed to connect to Ray")
        if sid not in self.jobs:
            raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")
        return self.jobs[sid]

    def submit_job(self, **submission: Any) -> str:
        sid = submission["submission_id"]
        if sid in self.jobs:
            raise RuntimeError(
                f"Request failed with status code 500: ValueError: Job with submission_id {sid} already exists."
            )
        self.submitted.append(submission)
        self.metadata[sid] = submission["metadata"]
        self.jobs[sid] = Details("PENDING")
        self.logs[sid] = ""
        return str(sid)

    def list_jobs(self) -> list[Details]:
        return [Details(d.status, d.driver_exit_code, sid, self.metadata.get(sid)) for sid, d in self.jobs.items()]

    def get_job_logs(self, sid: str) -> str:
        return self.logs[sid]

    def stop_job(self, sid: str) -> bool:
        self.stopped.append(sid)  # its driver stops its ranks, which stop at a checkpoint: STOPPED
        self.end(sid, "STOPPED")
        return True

    def write(self, sid: str, *lines: str) -> None:
        self.logs[sid] += "".join(line + "\n" for line in lines)
        self.chunk.set()

    def say(self, sid: str, seq: int, message: Any) -> None:
        self.write(sid, f"@@adapterd {seq} {message.model_dump_json()}")

    def end(self, sid: str, status: str, code: int | None = None) -> None:
        self.jobs[sid] = Details(status, code)
        self.chunk.set()

    async def tail_job_logs(self, sid: str) -> AsyncIterator[str]:
        self.tails += 1
        if self.tails > 1:
            self.retailed.set()
        sent, chunks = 0, 0
        while True:
            text = self.logs[sid]
            if len(text) > sent:
                yield text[sent:]
                sent, chunks = len(text), chunks + 1
                if self.tails == 1 and self.break_tail_after is not None and chunks >= self.break_tail_after:
                    self.on_break()
                    raise RuntimeError("WebSocket closed abnormally")
                continue
            if self.jobs[sid].status in ("SUCCEEDED", "FAILED", "STOPPED"):
                return
            self.chunk.clear()
            await self.chunk.wait()


def ray_settings(tmp_path: Path, **overrides: Any) -> RaySettings:
    return RaySettings(
        address="http://ray-head:8265", shared_dir=tmp_path / "shared", worker_resources={"CPU": 1}, **overrides
    )


def ray_job(tmp_path: Path, request_id: str = "big", attempt: int = 1) -> ChildJob:
    folder = tmp_path / "shared" / request_id
    spec = JobSpec(
        request=sft_request(request_id, resources={"gpus": 2}),
        checkpoints=folder / "checkpoints",
        artifact=folder / "artifact",
        progress_interval_s=0,
    )
    return ChildJob(spec, None, 2, attempt, "ray")


def source(tmp_path: Path, jobs: FakeJobs, env: dict[str, str] | None = None) -> RayChildSource:
    base = {"HF_TOKEN": "hf_secret", "PATH": "/daemon/bin", "HF_ENDPOINT": "http://hub", "TORCH_X": "1"}
    return RayChildSource(ray_settings(tmp_path), base if env is None else env, 120, client=jobs)


async def read(run: Any, count: int) -> list[Any]:
    messages = []
    async for message in run.messages():
        messages.append(message)
        if len(messages) == count:
            break
    return messages


async def test_a_new_run_is_submitted_once_with_its_id_its_run_file_and_no_secret(tmp_path: Path) -> None:
    jobs = FakeJobs()
    run = await source(tmp_path, jobs).start(ray_job(tmp_path))
    [submission] = jobs.submitted
    assert submission["submission_id"] == run.sid == "adapterd-big-a1"
    assert submission["metadata"] == {"adapterd_request_id": "big", "adapterd_attempt": "1"}
    run_file = tmp_path / "shared" / "big" / RUN_NAME
    assert submission["entrypoint"] == f"exec python -m handlers.child.ray_job {run_file}"
    plan = json.loads(run_file.read_text())
    assert plan["workers"] == 2 and plan["bundle"] == {"CPU": 1.0}
    assert json.loads((tmp_path / "shared" / "big" / "spec.json").read_text())["request"]["request_id"] == "big"
    env = submission["runtime_env"]["env_vars"]
    # The training stack's settings go; the Hub token and this host's own PATH do not (Jobs API readers see them).
    assert env["HF_ENDPOINT"] == "http://hub" and env["TORCH_X"] == "1"
    assert "HF_TOKEN" not in env and "PATH" not in env
    assert env["RAY_JOB_STOP_WAIT_TIME_S"] == "120" and env["RAY_DEDUP_LOGS"] == "0"
    assert run.place.pid is None and run.place.where == "ray job adapterd-big-a1"
    jobs.end(run.sid, "SUCCEEDED", 0)
    assert (await run.wait()).returncode == 0


async def test_the_hub_token_reaches_the_ranks_only_when_the_operator_passes_it(tmp_path: Path) -> None:
    jobs = FakeJobs()
    passing = RayChildSource(ray_settings(tmp_path, pass_hub_token=True), {"HF_TOKEN": "hf_secret"}, 60, client=jobs)
    await passing.start(ray_job(tmp_path))
    assert jobs.submitted[0]["runtime_env"]["env_vars"]["HF_TOKEN"] == "hf_secret"


async def test_a_run_already_on_the_cluster_is_followed_not_submitted_again(tmp_path: Path) -> None:
    """A daemon restarted mid-job (or the host a rebalance hands the request): the run of this attempt is running, so
    it is followed from its log. Of what it said before, its stage, first step and last checkpoint are passed on
    (what the supervisor keeps), not its old progress; what it says after, all of it, each line once."""
    jobs = FakeJobs()
    sid = run_id("big", 1, 1)
    jobs.jobs[sid] = Details("RUNNING")
    jobs.logs[sid] = ""
    jobs.write(sid, "adapterd ray job: 2 ranks on 1 node(s)", "(RankWorker pid=7) [rank 1] hello")
    jobs.say(sid, 1, StageEntered(stage="train"))
    jobs.say(sid, 2, FirstStep(time=1.0, step=1))
    jobs.say(sid, 3, ProgressReport(step=1, total_steps=9, loss=2.0))
    jobs.say(sid, 4, CheckpointSaved(step=2, path="/c/checkpoint-2"))
    jobs.say(sid, 5, ProgressReport(step=3, total_steps=9, loss=1.9))
    jobs.say(sid, 6, CheckpointSaved(step=4, path="/c/checkpoint-4"))
    run = await source(tmp_path, jobs).start(ray_job(tmp_path))
    assert jobs.submitted == [] and run.sid == sid
    caught_up = await read(run, 3)
    assert caught_up == [
        StageEntered(stage="train"),
        FirstStep(time=1.0, step=1),
        CheckpointSaved(step=4, path="/c/checkpoint-4"),
    ]
    jobs.say(sid, 7, ProgressReport(step=5, total_steps=9, loss=1.8))
    jobs.write(sid, "(RankWorker pid=7) [rank 0] later")
    jobs.say(sid, 8, RESULT)
    jobs.end(sid, "SUCCEEDED", 0)
    rest = [message async for message in run.messages()]
    assert rest == [ProgressReport(step=5, total_steps=9, loss=1.8), RESULT]
    assert (await run.wait()).returncode == 0
    log = (tmp_path / "shared" / "big" / "child.log").read_text().splitlines()
    assert log == [
        "adapterd ray job: 2 ranks on 1 node(s)",
        "(RankWorker pid=7) [rank 1] hello",
        "(RankWorker pid=7) [rank 0] later",
    ]


async def test_a_tail_dropped_while_the_run_goes_on_is_taken_up_again_without_a_line_twice(tmp_path: Path) -> None:
    jobs = FakeJobs()
    jobs.break_tail_after = 1
    run = await source(tmp_path, jobs).start(ray_job(tmp_path))
    jobs.jobs[run.sid] = Details("RUNNING")
    jobs.write(run.sid, "first line")
    jobs.say(run.sid, 1, StageEntered(stage="train"))
    [stage] = await read(run, 1)
    assert stage == StageEntered(stage="train")
    await asyncio.wait_for(jobs.retailed.wait(), 10)  # the run goes on: its log is tailed again
    jobs.say(run.sid, 2, ProgressReport(step=1, total_steps=2, loss=1.0))
    jobs.write(run.sid, "second line")
    jobs.say(run.sid, 3, RESULT)
    jobs.end(run.sid, "SUCCEEDED", 0)
    rest = [message async for message in run.messages()]
    assert rest == [ProgressReport(step=1, total_steps=2, loss=1.0), RESULT] and jobs.tails == 2
    assert (tmp_path / "shared" / "big" / "child.log").read_text() == "first line\nsecond line\n"


async def test_a_tail_dropped_and_the_run_ended_meanwhile_reads_the_rest_of_its_log_once(tmp_path: Path) -> None:
    jobs = FakeJobs()
    jobs.break_tail_after = 1
    run = await source(tmp_path, jobs).start(ray_job(tmp_path))
    jobs.say(run.sid, 1, StageEntered(stage="train"))
    jobs.write(run.sid, "first line")

    def the_run_ends() -> None:
        jobs.write(run.sid, "second line")
        jobs.say(run.sid, 2, RESULT)
        jobs.end(run.sid, "SUCCEEDED", 0)

    jobs.on_break = the_run_ends
    assert await read(run, 1) == [StageEntered(stage="train")]
    assert [message async for message in run.messages()] == [RESULT] and jobs.tails == 1
    assert (tmp_path / "shared" / "big" / "child.log").read_text() == "first line\nsecond line\n"


async def test_a_run_stopped_at_a_checkpoint_is_followed_by_the_next_run_of_the_attempt(tmp_path: Path) -> None:
    jobs = FakeJobs()
    jobs.jobs[run_id("big", 1, 1)] = Details("STOPPED")  # a pause, a preemption, a daemon's stop
    run = await source(tmp_path, jobs).start(ray_job(tmp_path))
    assert run.sid == "adapterd-big-a1-r2" and [s["submission_id"] for s in jobs.submitted] == [run.sid]
    # The next attempt (a retry) starts its own runs.
    again = await source(tmp_path, jobs).start(ray_job(tmp_path, attempt=2))
    assert again.sid == "adapterd-big-a2"


async def test_a_run_that_succeeded_is_followed_to_its_result_while_its_artifact_is_there(tmp_path: Path) -> None:
    jobs = FakeJobs()
    sid = run_id("big", 1, 1)
    jobs.jobs[sid] = Details("SUCCEEDED", 0)
    jobs.logs[sid] = ""
    jobs.say(sid, 1, RESULT)
    job = ray_job(tmp_path)
    # Its artifact gone from the shared folder: trained again (from its last checkpoint), as the next run.
    gone = await source(tmp_path, jobs).start(job)
    assert gone.sid == "adapterd-big-a1-r2"
    job.spec.artifact.mkdir(parents=True)
    del jobs.jobs["adapterd-big-a1-r2"]
    there = await source(tmp_path, jobs).start(job)
    assert there.sid == sid and [message async for message in there.messages()] == [RESULT]
    assert (await there.wait()).returncode == 0


async def test_an_earlier_run_still_going_is_stopped_before_the_next_is_submitted(tmp_path: Path) -> None:
    """A stall's stop that never reached the cluster left attempt 1's run training: attempt 2's submission stops it
    first, so the request never trains twice at once. Another request's run is left alone."""
    jobs = FakeJobs()
    here = source(tmp_path, jobs)
    first = await here.start(ray_job(tmp_path))
    other = await here.start(ray_job(tmp_path, "other"))
    jobs.jobs[first.sid] = jobs.jobs[other.sid] = Details("RUNNING")
    second = await here.start(ray_job(tmp_path, attempt=2))
    assert jobs.stopped == [first.sid] and second.sid == "adapterd-big-a2"
    assert jobs.jobs[first.sid].status == "STOPPED" and jobs.jobs[other.sid].status == "RUNNING"


async def test_a_run_submitted_by_a_peer_at_the_same_moment_is_followed(tmp_path: Path) -> None:
    jobs = FakeJobs()
    sid = run_id("big", 1, 1)
    source_here = source(tmp_path, jobs)
    real_info = jobs.get_job_info

    def racing(asked: str) -> Details:
        details = real_info(asked) if asked in jobs.jobs else None
        if details is None:  # said absent, then the peer's submission lands before ours
            jobs.jobs[asked], jobs.logs[asked] = Details("RUNNING"), ""
            raise RuntimeError(f"Job {asked} does not exist.")
        return details

    jobs.get_job_info = racing  # type: ignore[method-assign]
    run = await source_here.start(ray_job(tmp_path))
    assert run.sid == sid and jobs.submitted == []


async def test_its_end_as_ray_says_it(tmp_path: Path) -> None:
    jobs = FakeJobs()
    here = source(tmp_path, jobs)
    failed = await here.start(ray_job(tmp_path, "a"))
    jobs.write(failed.sid, "adapterd ray job: rank(s) ended: rank 1 killed by SIGKILL")
    jobs.end(failed.sid, "FAILED", 1)
    ended = await failed.wait()
    assert ended.returncode == 1 and ended.log_tail[-1].endswith("rank 1 killed by SIGKILL")
    stopped = await here.start(ray_job(tmp_path, "b"))
    jobs.say(stopped.sid, 1, StoppedAtCheckpoint(step=3, path="/c/checkpoint-3"))
    await stopped.stop(30)
    assert jobs.stopped == [stopped.sid]
    assert [m async for m in stopped.messages()] == [StoppedAtCheckpoint(step=3, path="/c/checkpoint-3")]
    assert (await stopped.wait()).returncode == 75
    lost = await here.start(ray_job(tmp_path, "c"))
    del jobs.jobs[lost.sid]  # a head restarted without its state: the run is gone
    jobs.chunk.set()
    ended = await lost.wait()
    assert ended.returncode == -9 and ended.log_tail[-1] == f"the Ray cluster lost job {lost.sid}"


async def test_a_cluster_that_does_not_answer_is_unreachable_not_a_fault(tmp_path: Path) -> None:
    jobs = FakeJobs()
    jobs.reachable = False
    with pytest.raises(EngineUnreachable, match="ray-head:8265 does not answer"):
        await source(tmp_path, jobs).start(ray_job(tmp_path))
    assert jobs.submitted == []


# The scheduler's side, on the core's fakes.


def ray_host(tmp_path: Path) -> Settings:
    return Settings(
        gpus=["0"],
        warm_child=False,
        work_dir=tmp_path / "work",
        hub_token=None,
        progress_interval_s=0,
        ray={"address": "http://ray-head:8265", "shared_dir": str(tmp_path / "shared"), "max_gpus": 8, "retry_s": 0.01},
    )


class Routed:
    """The host's sources as the service routes them: a scripted local child, and the Ray cluster's source."""

    def __init__(self, tmp_path: Path, jobs: FakeJobs) -> None:
        self.local = FakeChildren(Script())
        self.ray = RayChildSource(ray_settings(tmp_path, retry_s=0.01), {}, 60, client=jobs)


async def test_a_request_bigger_than_the_host_runs_on_ray_and_leaves_the_host_its_gpu(tmp_path: Path) -> None:
    from daemon.children.routed import RoutedChildren

    jobs = FakeJobs()
    routed = Routed(tmp_path, jobs)
    settings = ray_host(tmp_path)
    core = CoreOnFakes(settings, children=RoutedChildren(routed.local, routed.ray))
    big = core.record(sft_request("big", resources={"gpus": 4}), 0)
    assert await core.scheduler.offer(core.tp, big, core.request(big)) is Offered.STARTED
    await turns_until(lambda: bool(jobs.submitted))
    [submission] = jobs.submitted
    assert submission["submission_id"] == "adapterd-big-a1"
    # Its folder is on the shared folder, and the host's one GPU is still free for its own jobs.
    assert json.loads(Path(submission["entrypoint"].split()[-1]).read_text())["workers"] == 4
    assert Path(submission["entrypoint"].split()[-1]).parent == (tmp_path / "shared" / "big").absolute()
    assert core.slots.free == ["0"] and not core.slots.remote_free
    await turns_until(lambda: "started" in core.types("big"))
    started = core.events("big")[-1]
    assert started["type"] == "started" and started["child"] == "ray job adapterd-big-a1" and started["slot"] == "ray"


async def test_without_a_ray_cluster_a_request_bigger_than_the_host_is_rejected_naming_resources(
    tmp_path: Path,
) -> None:
    from daemon.admission.judge import refusal

    settings = ray_host(tmp_path)
    core = CoreOnFakes(settings)
    request = core.request(core.record(sft_request("big", resources={"gpus": 9}), 0))
    rejection = refusal(request, settings, core.slots)
    assert isinstance(rejection, Rejection) and rejection.errors[0].path == "resources.gpus"
    assert "its Ray cluster takes at most 8 (ray.max_gpus)" in rejection.errors[0].message
    no_ray = settings.model_copy(update={"ray": None})
    assert (
        refusal(
            request.model_copy(update={"resources": request.resources.model_copy(update={"gpus": 2})}),
            no_ray,
            core.slots,
        )
        is not None
    )
    assert (
        refusal(
            request.model_copy(update={"resources": request.resources.model_copy(update={"gpus": 2})}),
            settings,
            core.slots,
        )
        is None
    )


async def test_a_request_naming_two_hosts_runs_on_ray_though_the_hosts_gpus_would_hold_it(tmp_path: Path) -> None:
    """`resources.hosts`: a job spread over hosts goes to the Ray cluster, whose driver gets the hosts in its run file
    (one bundle per host, STRICT_SPREAD: `placement`); without a cluster it is rejected naming the field."""
    from daemon.admission.judge import refusal
    from daemon.children.routed import RoutedChildren

    jobs = FakeJobs()
    routed = Routed(tmp_path, jobs)
    settings = ray_host(tmp_path).model_copy(update={"gpus": ["0", "1"]})
    core = CoreOnFakes(settings, children=RoutedChildren(routed.local, routed.ray))
    spread = core.record(sft_request("spread", resources={"gpus": 2, "hosts": 2}), 0)
    assert await core.scheduler.offer(core.tp, spread, core.request(spread)) is Offered.STARTED
    await turns_until(lambda: bool(jobs.submitted))
    [submission] = jobs.submitted
    run = json.loads(Path(submission["entrypoint"].split()[-1]).read_text())
    assert (run["workers"], run["hosts"]) == (2, 2)
    assert core.slots.free == ["0", "1"]  # the host's two GPUs stay its own
    rejection = refusal(core.request(spread), settings.model_copy(update={"ray": None}), core.slots)
    assert isinstance(rejection, Rejection) and [(e.path, e.message) for e in rejection.errors] == [
        (
            "resources.hosts",
            "asks for 2 hosts; a job across hosts runs on a Ray cluster, and this host has none ([ray])",
        )
    ]
    too_many = sft_request("too-many", resources={"gpus": 16, "hosts": 2})  # ray.max_gpus is 8
    rejection = refusal(core.request(core.record(too_many, 1)), settings, core.slots)
    assert isinstance(rejection, Rejection) and rejection.errors[0].path == "resources.gpus"


def test_the_driver_places_one_bundle_per_rank_or_one_per_host_on_nodes_of_their_own() -> None:
    from handlers.child.ray_job import placement

    assert placement(4, 1, {"CPU": 1, "GPU": 1}, "PACK") == ([{"CPU": 1, "GPU": 1}] * 4, "PACK", [0, 1, 2, 3])
    assert placement(4, 2, {"CPU": 1, "GPU": 1}, "PACK") == (
        [{"CPU": 2, "GPU": 2}] * 2,
        "STRICT_SPREAD",
        [0, 0, 1, 1],
    )


async def test_a_cluster_away_makes_the_job_wait_saying_so_then_it_starts(tmp_path: Path) -> None:
    from daemon.children.routed import RoutedChildren

    jobs = FakeJobs()
    jobs.reachable = False
    routed = Routed(tmp_path, jobs)
    core = CoreOnFakes(ray_host(tmp_path), children=RoutedChildren(routed.local, routed.ray))
    big = core.record(sft_request("big", resources={"gpus": 2}), 0)
    assert await core.scheduler.offer(core.tp, big, core.request(big)) is Offered.STARTED
    await turns_until(lambda: "waiting" in core.types("big"))
    waiting = core.events("big")[-1]
    assert waiting["after"] == [] and "ray-head:8265 does not answer" in waiting["engine"]
    assert jobs.submitted == [] and core.types("big") == ["accepted", "waiting"]  # not failed, no attempt spent
    jobs.reachable = True
    await turns_until(lambda: bool(jobs.submitted))
    await turns_until(lambda: "started" in core.types("big"))
    assert core.types("big") == ["accepted", "waiting", "started"]


async def test_a_request_bigger_than_the_cluster_takes_is_rejected_naming_resources_and_the_one_behind_it_runs(
    tmp_path: Path,
) -> None:
    from daemon.children.routed import RoutedChildren

    jobs = FakeJobs()
    routed = Routed(tmp_path, jobs)
    core = CoreOnFakes(ray_host(tmp_path), children=RoutedChildren(routed.local, routed.ray))
    too_big = core.record(sft_request("too-big", resources={"gpus": 9}), 0)  # ray.max_gpus is 8
    behind = core.record(sft_request("behind", resources={"gpus": 2}), 1)
    await core.intake.take(core.tp, [too_big, behind])
    await turns_until(lambda: bool(jobs.submitted))
    [rejected] = core.events("too-big")
    assert rejected["type"] == "rejected" and rejected["errors"][0]["path"] == "resources.gpus"  # type: ignore[index]
    assert [letter.key for letter in core.dead_letters()] == [b"too-big"]
    assert [submission["submission_id"] for submission in jobs.submitted] == ["adapterd-behind-a1"]


async def test_hosts_uneven_or_without_a_ray_cluster_are_rejected_naming_resources_hosts_and_the_one_behind_trains(
    tmp_path: Path,
) -> None:
    """`resources.hosts` through intake, on a host without `[ray]` (nor a GPU: the request behind trains on the CPU):
    gpus not a multiple of it is `invalid`, several hosts with no cluster to run them is `rejected`; each names the
    field, goes to the DLQ, and the request behind them on the same partition trains."""
    core = CoreOnFakes(ray_host(tmp_path).model_copy(update={"ray": None, "gpus": []}), children=FakeChildren(SUCCEEDS))
    uneven = core.record(sft_request("uneven", resources={"gpus": 3, "hosts": 2}), 0)
    no_ray = core.record(sft_request("no-ray", resources={"gpus": 2, "hosts": 2}), 1)
    behind = core.record(sft_request("behind"), 2)
    await core.intake.take(core.tp, [uneven, no_ray, behind])
    await turns_until(lambda: "succeeded" in core.types("behind"))
    assert core.types("behind")[0] == "accepted" and core.types("behind")[-1] == "succeeded"
    for request_id, reason in (("uneven", "invalid"), ("no-ray", "resources")):
        [rejected] = core.events(request_id)
        assert rejected["type"] == "rejected" and rejected["reason"] == reason, rejected
        assert [error["path"] for error in rejected["errors"]] == ["resources.hosts"]  # type: ignore[union-attr]
    assert [letter.key for letter in core.dead_letters()] == [b"uneven", b"no-ray"]
