"""Jobs bigger than the host on a real local Ray cluster (testbed/ray_cluster.py: a head started by the test, two CPU
workers standing in for two hosts, gloo), the real broker, the daemon as a process, the tiny model and the local Hub.
The host has no GPU, so a request for two GPUs is bigger than it and goes to Ray (`[ray]`): it trains across two ranks
with the per-step losses of the same job run on two local ranks and its log is served by `adapterd logs`; a cancel
leaves the Ray job stopped and no rank running; a daemon SIGKILLed mid-job and started again follows the same Ray job
(Ray lists one) to one Hub commit; a rank killed mid-job ends the attempt retryable and the next one resumes from the
store's newest checkpoint, no checkpointed step trained again; a cluster stopped before the submission makes the
request wait, saying so, and it runs once the cluster is back."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from daemon.cli.cancel import cancel
from daemon.settings import Settings
from daemon.settings.ray import RaySettings
from schemas import Cancel, Cancelled, Checkpoint, Event, Progress, Retrying, Started, Succeeded, Waiting
from testbed.client import submit, submit_and_follow, terminal_events
from testbed.data import CHAT_ROWS
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, settings_environment
from testbed.ray_cluster import RayCluster
from tests.handlers.test_sharding import TINY_PARAMS, launch_two_ranks, step_losses
from tests.helpers import fleet_key, sft_request

pytestmark = pytest.mark.slow


def on_ray(settings: Settings, cluster: RayCluster, tmp_path: Path, **overrides: Any) -> Settings:
    """The host as the operator sets it: no GPU, the Ray cluster for what is bigger, its folder shared (here: a
    folder of this machine, which is the cluster's one node too), checkpoints to a store."""
    return settings.model_copy(
        update={
            "gpus": [],
            "warm_child": False,
            "logs_token": SecretStr("the-fleets-logs-token"),
            "event_signing_key_file": fleet_key(tmp_path / "keys"),
            "checkpoint_store": str(tmp_path / "store"),
            "ray": RaySettings(
                address=cluster.address,
                shared_dir=tmp_path / "shared",
                worker_resources={"CPU": 1},
                python=sys.executable,
                max_gpus=2,
                stop_grace_s=30,
                retry_s=1,
            ),
            **overrides,
        }
    )


def two_ranks(request_id: str, model: Path, steps: int, **overrides: Any) -> dict[str, Any]:
    """The tiny model's SFT on two GPUs (ranks): a global batch of 4, per-device 2."""
    return sft_request(
        request_id,
        model={"id": str(model), "dtype": "float32"},
        dataset={"rows": CHAT_ROWS},
        sft={"max_length": 64},
        resources={"gpus": 2},
        training={"max_steps": steps, "learning_rate": 1e-2, "per_device_train_batch_size": 2, **overrides},
    )


@pytest.fixture
def model(tiny_model_dir: Path, tmp_path: Path) -> Path:
    """The tiny model under the test's folder, where `allowed_local_model_roots` lets a request name it."""
    return Path(shutil.copytree(tiny_model_dir, tmp_path / "model"))


def ray_jobs_of(cluster: RayCluster, request_id: str) -> list[Any]:
    from ray.job_submission import JobSubmissionClient

    jobs = JobSubmissionClient(cluster.address).list_jobs()
    return [job for job in jobs if (job.metadata or {}).get("adapterd_request_id") == request_id]


def ranks_running(request_id: str) -> list[int]:
    """The runners of the request's ranks still alive on this machine (their environment names its job)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = environment(int(pid))
        except OSError:
            continue
        if b"ADAPTERD_RAY=1" in environ and any(
            line.startswith(b"ADAPTERD_JOB=") and f"/{request_id}/spec.json".encode() in line for line in environ
        ):
            found.append(int(pid))
    return found


async def until_logged(daemon: DaemonProcess, event: str, timeout_s: float = 180) -> None:
    """Until the daemon's log has `event`. A log file gives no notification: this polls it, as test_pause.py does."""
    async with asyncio.timeout(timeout_s):
        while not any(line.get("event") == event for line in daemon.log_lines()):
            await asyncio.sleep(0.2)


def environment(pid: int) -> list[bytes]:
    return Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")


def losses(events: list[Event]) -> dict[int, float]:
    return {e.step: e.loss for e in events if isinstance(e, Progress) and e.loss is not None}


async def test_a_request_bigger_than_the_host_trains_sharded_on_ray_as_on_two_local_ranks(
    settings: Settings, published: HubServer, ray_cluster: RayCluster, model: Path, tmp_path: Path
) -> None:
    host = on_ray(settings, ray_cluster, tmp_path)
    # A full fine-tune sharded across the two workers (FSDP2, `resources.shard`): each holds half the model.
    request = {**two_ranks("on-ray", model, 4), "peft": None, "resources": {"gpus": 2, "shard": "fsdp"}}
    with DaemonProcess(host, tmp_path / "daemon.log"):
        await submit(host, request)
        events = (await terminal_events(host, {"on-ray"}))["on-ray"]
        logs = subprocess.run(
            [sys.executable, "-m", "daemon.cli.app", "logs", "on-ray"],
            env=settings_environment(host),
            capture_output=True,
            text=True,
            timeout=120,
        )
    done = events[-1]
    assert isinstance(done, Succeeded), done
    started = next(e for e in events if isinstance(e, Started))
    assert started.child == "ray job adapterd-on-ray-a1" and started.pid is None and started.slot == "ray"
    assert done.metrics["world_size"] == 2.0  # over the two ranks Ray placed...
    assert done.metrics["rank0_param_count"] == done.metrics["rank1_param_count"] == TINY_PARAMS / 2  # ...sharded
    assert "model.safetensors" in done.files  # the full model, gathered from the shards
    [ray_job] = ray_jobs_of(ray_cluster, "on-ray")
    assert ray_job.submission_id == "adapterd-on-ray-a1" and str(ray_job.status.value) == "SUCCEEDED"
    # The same job on two local ranks (torchrun, as the daemon launches a job of two GPUs): the same losses.
    _, local = launch_two_ranks(request, tmp_path / "local")
    assert list(losses(events).values()) == pytest.approx(step_losses(local), rel=1e-5)
    # Its log, through the host's endpoint: both ranks' lines, none of the daemon's marker lines.
    assert logs.returncode == 0, logs.stderr
    assert "[rank 0] adapterd child " in logs.stdout and "[rank 1] adapterd child " in logs.stdout
    assert "@@adapterd" not in logs.stdout


async def test_a_cancelled_job_on_ray_leaves_the_ray_job_stopped_and_no_rank_running(
    settings: Settings, published: HubServer, ray_cluster: RayCluster, model: Path, tmp_path: Path
) -> None:
    host = on_ray(settings, ray_cluster, tmp_path)
    with DaemonProcess(host, tmp_path / "daemon.log"):
        await submit_and_follow(
            host, two_ranks("cancel-ray", model, 100_000), until=lambda events: isinstance(events[-1], Progress)
        )
        assert ranks_running("cancel-ray")  # training, on two ranks
        await cancel(host, Cancel(request_id="cancel-ray", reason="not wanted"))
        events = (await terminal_events(host, {"cancel-ray"}))["cancel-ray"]
    assert isinstance(events[-1], Cancelled), events[-1]
    [ray_job] = ray_jobs_of(ray_cluster, "cancel-ray")
    assert str(ray_job.status.value) == "STOPPED"
    assert ranks_running("cancel-ray") == []  # `cancelled` is published once Ray says the job is over


async def test_a_daemon_killed_mid_job_follows_the_same_ray_job_after_its_restart_to_one_commit(
    settings: Settings, published: HubServer, ray_cluster: RayCluster, model: Path, tmp_path: Path
) -> None:
    # A SIGKILLed member leaves the group only when its session times out: the restart's join waits that long.
    host = on_ray(settings, ray_cluster, tmp_path, session_timeout_ms=10_000)
    daemon = DaemonProcess(host, tmp_path / "daemon.log").start()
    try:
        await submit_and_follow(
            host, two_ranks("restart-ray", model, 200, save_steps=20), until=lambda e: isinstance(e[-1], Checkpoint)
        )
        daemon.stop(signal.SIGKILL)
        ranks = ranks_running("restart-ray")
        assert len(ranks) == 2  # the Ray job goes on without its daemon...
        for rank in ranks:  # ...held still while the daemon is away, so it is surely mid-job when followed again
            os.kill(rank, signal.SIGSTOP)
        daemon = DaemonProcess(host, tmp_path / "daemon-2.log").start()
        await until_logged(daemon, "ray.attached")
        for rank in ranks:
            os.kill(rank, signal.SIGCONT)
        events = (await terminal_events(host, {"restart-ray"}))["restart-ray"]
    finally:
        daemon.stop()
    done = events[-1]
    assert isinstance(done, Succeeded), done
    [ray_job] = ray_jobs_of(ray_cluster, "restart-ray")  # followed again, not submitted again
    assert ray_job.submission_id == "adapterd-restart-ray-a1"
    assert {e.child for e in events if isinstance(e, Started)} == {"ray job adapterd-restart-ray-a1"}
    assert len(published.commits(done.repo_id)) == 1
    [attached] = [line for line in daemon.log_lines() if line.get("event") == "ray.attached"]
    assert attached["status"] == "RUNNING"  # it was still training when the daemon came back


async def test_a_rank_killed_mid_job_resumes_from_the_stores_checkpoint_without_a_step_trained_twice(
    settings: Settings, published: HubServer, ray_cluster: RayCluster, model: Path, tmp_path: Path
) -> None:
    host = on_ray(settings, ray_cluster, tmp_path)
    with DaemonProcess(host, tmp_path / "daemon.log"):
        before = await submit_and_follow(
            host,
            two_ranks("lost-rank", model, 120, save_steps=10),
            until=lambda e: isinstance(e[-1], Checkpoint) and e[-1].location == "store",
        )
        assert before[-1].attempt == 1
        [rank1] = [pid for pid in ranks_running("lost-rank") if b"RANK=1" in environment(pid)]
        os.kill(rank1, signal.SIGKILL)  # a host lost: its rank dies without a word
        events = (await terminal_events(host, {"lost-rank"}))["lost-rank"]
    done = events[-1]
    assert isinstance(done, Succeeded), done
    retrying = next(e for e in events if isinstance(e, Retrying))
    assert retrying.code == "child_crashed" and "rank 1 was killed by SIGKILL" in retrying.message
    again = [e for e in events if isinstance(e, Started)][-1]
    assert again.attempt == 2 and again.resumed_step is not None
    # The newest whole checkpoint: the store's, or (no newer one there yet) its original in the shared folder.
    saved = [e.step for e in events if isinstance(e, Checkpoint) and e.attempt == 1]
    stored = [e.step for e in events if isinstance(e, Checkpoint) and e.location == "store" and e.attempt == 1]
    assert again.resumed_step in saved and again.resumed_step >= max(stored)
    steps = [e.step for e in events if isinstance(e, Progress) and e.attempt == 2]
    assert steps and min(steps) == again.resumed_step + 1  # no checkpointed step trained again


async def test_a_cluster_stopped_before_the_submission_makes_the_request_wait_then_it_runs(
    settings: Settings, published: HubServer, ray_cluster: RayCluster, model: Path, tmp_path: Path
) -> None:
    host = on_ray(settings, ray_cluster, tmp_path)
    ray_cluster.stop()
    with DaemonProcess(host, tmp_path / "daemon.log"):
        waited = await submit_and_follow(
            host, two_ranks("ray-away", model, 4), until=lambda e: isinstance(e[-1], Waiting)
        )
        assert ray_cluster.address.split("//")[1] in str(waited[-1].engine)
        ray_cluster.start()
        events = (await terminal_events(host, {"ray-away"}))["ray-away"]
    assert isinstance(events[-1], Succeeded), events[-1]
    assert [e.type for e in events].count("waiting") == 1 and {e.attempt for e in events} == {1}
    assert [job.submission_id for job in ray_jobs_of(ray_cluster, "ray-away")] == ["adapterd-ray-away-a1"]
