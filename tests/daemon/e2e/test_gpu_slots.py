"""Two GPU slots, two jobs at once, each child on its own GPU; `submit --wait` exit codes; metrics after
the jobs. The daemon runs as the systemd unit starts it: its ExecStart line, a TOML file, the Hub
token as a credential file."""

import asyncio
import json
import sys
from pathlib import Path

import pytest

from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas import TERMINAL_TYPES, Checkpoint, Failed, Progress, Started, Succeeded, parse_event
from testbed.client import run_to_end, submit, terminal_events
from testbed.data import TINY_MODEL
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess, NotifySocket, http_get, metric, unit_daemon, write_config
from tests.helpers import assert_adapter_trained, assert_full_model_trained, download, ids_on_partitions, sft_request

pytestmark = pytest.mark.slow


async def adapterd(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "daemon.cli.app", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    return process.returncode or 0, output.decode()


async def test_two_gpus_run_two_jobs_at_once_each_on_its_own(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    two_gpus = settings.model_copy(update={"gpus": ["7", "9"], "requests_topic": settings.requests_topic + "-2p"})
    await ensure_topics(two_gpus, partitions=2)
    good, bad = ids_on_partitions("slots", 2)
    files = {}
    for request in (
        sft_request(
            good, training={"max_steps": 12, "save_steps": 4, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
        ),
        sft_request(bad, model={"id": "tiny/no-such-model"}),
    ):
        files[request["request_id"]] = tmp_path / f"{request['request_id']}.json"
        files[request["request_id"]].write_text(json.dumps(request))
    config = write_config(two_gpus, tmp_path / "client.toml")

    notify = NotifySocket(tmp_path / "notify.sock")
    daemon = unit_daemon(two_gpus, tmp_path, extra_env=notify.environment()).start()
    try:
        await notify.wait_for("READY=1", timeout_s=60)
        (good_rc, good_out), (bad_rc, bad_out) = await asyncio.gather(
            adapterd("submit", str(files[good]), "--wait", "--config", str(config)),
            adapterd("submit", str(files[bad]), "--wait", "--config", str(config)),
        )
        assert (good_rc, bad_rc) == (0, 1), good_out + bad_out
        assert f"{good} succeeded" in good_out and f"{bad} failed" in bad_out and "model_unavailable" in bad_out

        events = await terminal_events(two_gpus, {good, bad})
        # Both jobs started before either ended: they ran at once, each on one of the two GPUs.
        ordered = sorted([*events[good], *events[bad]], key=lambda e: e.time)
        first_terminal = next(i for i, e in enumerate(ordered) if e.type in TERMINAL_TYPES)
        started = [e for e in ordered[:first_terminal] if isinstance(e, Started)]
        assert {e.request_id for e in started} == {good, bad}
        assert sorted(e.slot for e in started) == ["7", "9"]
        for event in started:
            child_log = (two_gpus.jobs_dir / str(event.request_id) / "child.log").read_text()
            assert f"CUDA_VISIBLE_DEVICES={event.slot}" in child_log

        done, failed = events[good][-1], events[bad][-1]
        assert isinstance(done, Succeeded) and isinstance(failed, Failed) and failed.code == "model_unavailable"
        assert [e.step for e in events[good] if isinstance(e, Checkpoint)] == [4, 8, 12]
        progress = [e for e in events[good] if isinstance(e, Progress)]
        assert progress[-1].step == progress[-1].total_steps == 12
        assert all(p.learning_rate is not None for p in progress)
        # An ETA from the second step on: the first carries the run's set-up (handlers/toolkit/reporting.py `_eta`).
        assert [p.eta_s is None for p in progress] == [p.step < 2 for p in progress]
        assert any(p.tokens_per_s and p.tokens_per_s > 0 for p in progress)

        assert two_gpus.metrics_address is not None
        _, body = http_get(two_gpus.metrics_address, "/metrics")
        text = body.decode()
        assert metric(text, "adapterd_jobs_total", outcome="succeeded") == 1.0
        assert metric(text, "adapterd_jobs_total", outcome="failed") == 1.0
        assert metric(text, "adapterd_stage_duration_seconds_count", stage="train") == 1.0
        assert metric(text, "adapterd_slots") == 2.0 and metric(text, "adapterd_slots_busy") == 0.0
        _, status = http_get(two_gpus.metrics_address, "/status")
        assert json.loads(status)["jobs"] == []

        # Every log line of a job carries its request id, the child's own output included.
        lines = daemon.log_lines()
        job_lines = [line for line in lines if str(line.get("event", "")).startswith("job.")]
        assert job_lines and all(line.get("request_id") in {good, bad} for line in job_lines)
        child_output = [
            line for line in lines if line.get("event") == "child.output" and line.get("request_id") == good
        ]
        assert any("CUDA_VISIBLE_DEVICES=" in line["line"] for line in child_output)
        assert any("'loss'" in line["line"] for line in child_output)  # the trainer's own log lines
    finally:
        assert daemon.stop() == 0
        notify.close()


async def test_a_two_gpu_request_runs_data_parallel_on_both(
    settings: Settings, published: HubServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    two_gpus = settings.model_copy(update={"gpus": ["7", "9"], "warm_child": False})
    daemon = DaemonProcess(two_gpus, tmp_path / "daemon.log").start()
    try:
        events = await run_to_end(two_gpus, sft_request("two-gpu-job", resources={"gpus": 2}))
    finally:
        daemon.stop()
    started = next(e for e in events if isinstance(e, Started))
    done = events[-1]
    assert started.slot == "7,9"
    assert isinstance(done, Succeeded), done
    assert done.metrics["world_size"] == 2.0  # the trainer ran data-parallel over two processes
    child_log = (two_gpus.jobs_dir / "two-gpu-job" / "child.log").read_text()
    for rank in (0, 1):
        assert f"rank {rank} of 2, job" in child_log and "CUDA_VISIBLE_DEVICES=7,9" in child_log
    assert_adapter_trained(download(published.endpoint, done.repo_id, done.commit_sha, tmp_path / "dl"), tiny_model_dir)


async def test_a_two_gpu_request_sharded_pushes_the_full_model_gathered_from_its_shards(
    settings: Settings, published: HubServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """`resources.shard: fsdp` through the daemon (two GPU ids on a host without GPUs: two CPU ranks, gloo): each rank
    held half the model (handlers/toolkit/distributed/fsdp.py), and the Hub got one full model, gathered from the
    shards."""
    two_gpus = settings.model_copy(update={"gpus": ["7", "9"], "warm_child": False})
    daemon = DaemonProcess(two_gpus, tmp_path / "daemon.log").start()
    try:
        request = sft_request(
            "sharded-job",
            peft=None,
            model={"id": TINY_MODEL, "dtype": "float32"},
            sft={"max_length": 64},
            resources={"gpus": 2, "shard": "fsdp"},
        )
        events = await run_to_end(two_gpus, request)
    finally:
        daemon.stop()
    done = events[-1]
    assert isinstance(done, Succeeded), done
    assert next(e for e in events if isinstance(e, Started)).slot == "7,9"
    assert done.metrics["world_size"] == 2.0
    assert done.metrics["rank0_param_count"] == done.metrics["rank1_param_count"] == 28_960 / 2  # the tiny model's half
    assert "model.safetensors" in done.files and "adapter_config.json" not in done.files
    # Each rank's figures reach the events through the daemon: progress names both ranks, succeeded the largest peak.
    progress = [e for e in events if isinstance(e, Progress)]
    assert progress and all([rank.rank for rank in e.ranks or []] == [0, 1] for e in progress)
    assert done.memory is not None and done.memory.device_peak_bytes == max(
        done.metrics["rank0_peak_bytes"], done.metrics["rank1_peak_bytes"]
    )
    assert "[rank1] adapterd child " in (two_gpus.jobs_dir / "sharded-job" / "child.log").read_text()
    assert_full_model_trained(
        download(published.endpoint, done.repo_id, done.commit_sha, tmp_path / "dl"), tiny_model_dir
    )


async def started(settings: Settings, request_ids: set[str], count: int, timeout_s: float = 240) -> None:
    """Until `count` of `request_ids` have a `started` event."""
    seen: set[str] = set()
    async with asyncio.timeout(timeout_s), TopicReader(settings, settings.events_topic) as reader:
        async for record in reader.records():
            event = parse_event(record.value or b"")
            if isinstance(event, Started) and event.request_id in request_ids:
                seen.add(event.request_id)
                if len(seen) >= count:
                    return


async def test_a_two_gpu_request_behind_a_stream_of_one_gpu_requests_starts_before_the_stream_is_exhausted(
    settings: Settings, published: HubServer, tmp_path: Path
) -> None:
    """Issue 62, item 6: one-GPU requests on three partitions, two running and the next ready for each slot that frees,
    then a two-GPU request on a fourth partition, then three more one-GPU requests. With `reserve_after_s` 0 the host is
    reserved for the two-GPU request once it is held (daemon/jobs/reservation.py): the stream's requests (no
    `timeout_s` of their own, so none backfills) wait, and it starts as soon as the jobs running then end. Without the
    reservation (`reserve_after_s` 1e9) it started after all six: each slot that freed was taken by the stream."""
    two_gpus = settings.model_copy(
        update={"gpus": ["7", "9"], "requests_topic": settings.requests_topic + "-4p", "reserve_after_s": 0.0}
    )
    await ensure_topics(two_gpus, partitions=4)
    ids = [ids_on_partitions(f"stream{n}", 4) for n in range(2)]
    first, second, big = ids[0][:3], ids[1][:3], ids[0][3]
    stream = [*first, *second]
    quick = {"max_steps": 2, "learning_rate": 1e-2, "per_device_train_batch_size": 2}
    daemon = DaemonProcess(two_gpus, tmp_path / "daemon.log").start()
    try:
        for request_id in first:
            await submit(two_gpus, sft_request(request_id, training=quick))
        await started(two_gpus, set(first), 2)  # both slots busy: the two-GPU request is held when it is read
        await submit(two_gpus, sft_request(big, training=quick, resources={"gpus": 2}))
        for request_id in second:
            await submit(two_gpus, sft_request(request_id, training=quick))
        events = await terminal_events(two_gpus, {*stream, big}, timeout_s=600)
    finally:
        daemon.stop()
    assert all(isinstance(events[request_id][-1], Succeeded) for request_id in [*stream, big]), {
        k: v[-1] for k, v in events.items()
    }
    began = {
        request_id: next(e.time for e in events[request_id] if isinstance(e, Started)) for request_id in [*stream, big]
    }
    assert next(e for e in events[big] if isinstance(e, Started)).slot == "7,9"
    after = [request_id for request_id in stream if began[request_id] > began[big]]
    # The two running when it was submitted, and at most one that took the first freed slot
    # before it was read, went first.
    assert len(after) >= 3, sorted(began.items(), key=lambda item: item[1])
