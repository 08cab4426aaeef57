"""SIGTERM mid-training: the job saves a checkpoint and stops uncommitted, systemd is told to wait;
after a restart the request resumes from that checkpoint and makes one Hub commit. SIGKILL too, a sharded
job's (two GPU ids on a host without GPUs: two CPU ranks) as well."""

import signal
from pathlib import Path

import pytest

from daemon.kafka.event_reader import EventStream
from daemon.settings import Settings
from schemas import TERMINAL_TYPES, Checkpoint, Event, Progress, Started, Succeeded
from testbed.client import child_pid, committed_offset, past_step, submit_and_follow
from testbed.data import CHAT_ROWS, TINY_MODEL
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, NotifySocket, run_to_terminal, wait_until_gone
from tests.helpers import sft_request

pytestmark = pytest.mark.slow


async def test_sigterm_checkpoints_and_a_restart_resumes_there(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    request_id = "stop-resume-1"
    request = sft_request(
        request_id,
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 100, "save_steps": 10_000, "learning_rate": 1e-3, "per_device_train_batch_size": 2},
    )
    notify = NotifySocket(tmp_path / "notify.sock")
    try:
        with DaemonProcess(settings, tmp_path / "daemon.log", extra_env=notify.environment()) as daemon:
            await notify.wait_for("READY=1", timeout_s=60)
            trainer = child_pid(await submit_and_follow(settings, request, until=past_step(3)))
            assert daemon.process is not None
            daemon.process.send_signal(signal.SIGTERM)
            await notify.wait_for("STOPPING=1", timeout_s=30)
            extend = await notify.wait_for("EXTEND_TIMEOUT_USEC=", timeout_s=30)
            assert int(extend.split("=")[1]) >= settings.drain_timeout_s * 1_000_000
            assert daemon.stop(timeout_s=settings.drain_timeout_s + 30) == 0
    finally:
        notify.close()

    stopped = [line for line in daemon.log_lines() if line.get("event") == "job.stopped_at_checkpoint"]
    assert len(stopped) == 1 and stopped[0]["request_id"] == request_id
    step = stopped[0]["step"]
    assert 3 <= step < 100 and (settings.jobs_dir / request_id / "checkpoints" / f"checkpoint-{step}").is_dir()
    await wait_until_gone(trainer, timeout_s=5)  # the trainer did not outlive the daemon
    assert await committed_offset(settings) is None  # not committed: the request will be read again
    async with EventStream(settings) as stream:
        assert not [e async for e in stream.events(request_id, follow=False) if e.type in TERMINAL_TYPES]

    events = await run_to_terminal(DaemonProcess(settings, tmp_path / "daemon-2.log"), request_id)
    done = events[-1]
    assert isinstance(done, Succeeded), done
    second_run = events[[i for i, e in enumerate(events) if isinstance(e, Started)][-1] :]
    resumed_steps = [e.step for e in second_run if isinstance(e, Progress)]
    assert resumed_steps[0] == step + 1 and resumed_steps[-1] == 100  # resumed, not from step 0
    assert len(published.commits(f"results/{request_id}")) == 1
    assert await committed_offset(settings) == 1


async def test_sigkill_mid_training_kills_the_trainer_and_a_restart_resumes_from_the_last_checkpoint(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    # A SIGKILLed member leaves the group only when its session times out: the restart's join waits
    # that long (45 s by default), so the test's session is short.
    settings = settings.model_copy(update={"session_timeout_ms": 10_000})
    request_id = "kill-resume-1"
    request = sft_request(
        request_id,
        dataset={"rows": CHAT_ROWS},
        training={"max_steps": 100, "save_steps": 5, "learning_rate": 1e-3, "per_device_train_batch_size": 2},
    )
    with DaemonProcess(settings, tmp_path / "daemon.log") as daemon:
        saved = await submit_and_follow(
            settings, request, until=lambda events: isinstance(events[-1], Checkpoint) and events[-1].step >= 5
        )
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    await wait_until_gone(child_pid(saved))  # PR_SET_PDEATHSIG: no trainer outlives the daemon
    assert await committed_offset(settings) is None

    checkpoints = sorted(
        int(p.name.split("-")[1]) for p in (settings.jobs_dir / request_id / "checkpoints").glob("checkpoint-*")
    )
    assert checkpoints and checkpoints[-1] % 5 == 0
    events = await run_to_terminal(DaemonProcess(settings, tmp_path / "daemon-2.log"), request_id)
    assert isinstance(events[-1], Succeeded), events[-1]
    second_run = events[[i for i, e in enumerate(events) if isinstance(e, Started)][-1] :]
    resumed_steps = [e.step for e in second_run if isinstance(e, Progress)]
    assert resumed_steps[0] == checkpoints[-1] + 1 and resumed_steps[-1] == 100
    assert len(published.commits(f"results/{request_id}")) == 1


async def test_a_sharded_job_sigkilled_with_its_daemon_resumes_after_a_restart_at_the_step_after_its_checkpoint(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    """A sharded full fine-tune (two CPU ranks) whose daemon is SIGKILLed mid-job: after a restart it resumes from its
    last checkpoint (handlers/toolkit/distributed/checkpoints.py: the optimizer's state in torch distributed checkpoint
    files, each rank its shard) at the step after it, its losses over the steps the first attempt had trained past
    that checkpoint are the first attempt's, and the Hub gets one commit."""
    # A SIGKILLed member leaves the group only when its session times out: the restart's join waits that long.
    two_gpus = settings.model_copy(update={"gpus": ["7", "9"], "warm_child": False, "session_timeout_ms": 10_000})
    request_id = "sharded-kill-1"
    request = sft_request(
        request_id,
        peft=None,
        model={"id": TINY_MODEL, "dtype": "float32"},
        sft={"max_length": 64},
        resources={"gpus": 2, "shard": "fsdp"},
        training={"max_steps": 40, "save_steps": 5, "learning_rate": 1e-2, "per_device_train_batch_size": 2},
    )
    with DaemonProcess(two_gpus, tmp_path / "daemon.log") as daemon:
        # until it trained past its checkpoint: steps the next attempt trains again
        trained = await submit_and_follow(two_gpus, request, until=past_its_checkpoint, timeout_s=600)
        assert daemon.stop(signal.SIGKILL) == -signal.SIGKILL
    first = {e.step: e.loss for e in trained if isinstance(e, Progress) and e.loss is not None}
    await wait_until_gone(child_pid(trained))
    assert await committed_offset(two_gpus) is None

    checkpoints = sorted(
        int(p.name.split("-")[1]) for p in (two_gpus.jobs_dir / request_id / "checkpoints").glob("checkpoint-*")
    )
    assert checkpoints and checkpoints[-1] % 5 == 0
    assert (
        len(
            list(
                (two_gpus.jobs_dir / request_id / "checkpoints" / f"checkpoint-{checkpoints[-1]}" / "sharded").iterdir()
            )
        )
        == 2
    )
    events = await run_to_terminal(DaemonProcess(two_gpus, tmp_path / "daemon-2.log"), request_id)
    assert isinstance(events[-1], Succeeded), events[-1]
    second_run = events[[i for i, e in enumerate(events) if isinstance(e, Started)][-1] :]
    resumed = {e.step: e.loss for e in second_run if isinstance(e, Progress) and e.loss is not None}
    assert min(resumed) == checkpoints[-1] + 1 and max(resumed) == 40  # resumed, not from step 0
    # The steps both attempts trained. None when the SIGKILL came just as the child saved its next checkpoint, before
    # its daemon read that it had (a loaded machine; CI once): the restart resumed from that one, and nothing was
    # trained twice to compare (the resume at the step after the newest checkpoint on disk is asserted above).
    again = sorted(step for step in first if step in resumed)
    assert [resumed[step] for step in again] == pytest.approx([first[step] for step in again], rel=1e-4)
    assert events[-1].metrics["rank0_param_count"] == 28_960 / 2
    assert len(published.commits(f"results/{request_id}")) == 1


def past_its_checkpoint(events: list[Event]) -> bool:
    """Two steps with a loss trained past its latest checkpoint."""
    saved = [e.step for e in events if isinstance(e, Checkpoint)]
    last = events[-1]
    return bool(saved) and isinstance(last, Progress) and last.loss is not None and last.step >= saved[-1] + 2
