"""A child on this host through the child seam (daemon/children/child.py): its job written into its folder as
before (`spec.json`, its output in `child.log`), its status pipe read for it and handed on as a stream of decoded
messages, what it said before it was ready and while it stopped included, its exit and its log's tail. A stand-in
child that speaks the protocol without the training stack (tests/daemon/children/status_child.py): a second."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from daemon.children.child import Child, ChildJob, write_job
from handlers.protocol import JobSpec, StageEntered, StoppedAtCheckpoint
from tests.helpers import sft_request


async def test_a_local_childs_messages_come_as_a_stream_through_its_stop_and_its_job_is_written_as_before(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "jobs" / "r1"
    spec = JobSpec(
        request=sft_request("r1"),
        checkpoints=folder / "checkpoints",
        artifact=folder / "artifact",
        progress_interval_s=0,
    )
    child = await Child.spawn(
        dict(os.environ), tmp_path / "children.log", entry=("tests.daemon.children.status_child",)
    )
    try:
        given = write_job(ChildJob(spec, None), folder)
        await child.begin(given, "r1")
        assert JobSpec.model_validate_json((folder / "spec.json").read_text()) == spec
        assert child.place.pid == child.process.pid and child.place.log == str(folder / "child.log")
        messages = child.messages()
        async with asyncio.timeout(30):  # a stream that loses a message fails here rather than hangs
            # What it said before it was ready, then what it says of its job.
            assert [await anext(messages), await anext(messages)] == [
                StageEntered(stage="preflight"),
                StageEntered(stage="train"),
            ]
            await child.stop(grace_s=5.0)  # SIGTERM: it says where it stopped, then exits
            assert [message async for message in messages] == [StoppedAtCheckpoint(step=3, path="checkpoint-3")]
        exited = await child.wait()
    finally:
        await child.stop(0)
    assert exited.returncode == 75 and exited.describe() == "exit status 75"
    assert (
        exited.log_tail == ["status child: job r1"] and (folder / "child.log").read_text() == "status child: job r1\n"
    )
