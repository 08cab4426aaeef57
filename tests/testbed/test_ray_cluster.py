"""testbed/ray_cluster.py's local Ray cluster: it runs a job submitted through the Jobs API, stops (an outage)
leaving no process of it behind, and comes back at the same address; and what the daemon's Ray client relies on
of the Jobs API: a job is forgotten by a restarted cluster, and a submission id is taken once. A head whose port is
taken when it first starts comes up on others; at a restart it keeps its address and says why it could not."""

from __future__ import annotations

import socket
import sys
import time
import uuid
from pathlib import Path

import pytest
from ray.job_submission import JobStatus, JobSubmissionClient

from testbed.ray_cluster import RayCluster

pytestmark = pytest.mark.slow

ENDED = {JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED}
HELLO = "python -c \"print('hello from ray')\""


def wait_for(client: JobSubmissionClient, job_id: str, wanted: set[JobStatus], timeout_s: float = 120) -> JobStatus:
    """The job's status once it is one of `wanted` (or has ended): the Jobs API has no call that waits, so it
    is asked again every 0.2 s, up to the bound."""
    deadline = time.monotonic() + timeout_s
    while (status := client.get_job_status(job_id)) not in wanted | ENDED:
        assert time.monotonic() < deadline, f"job {job_id} still {status} after {timeout_s} s"
        time.sleep(0.2)
    return status


def commands_naming(text: str) -> list[str]:
    """The command lines of the live processes (zombies aside) that contain `text`."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or (entry / "stat").read_bytes().rpartition(b")")[2].split()[0] == b"Z":
                continue
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if text in command:
            found.append(f"{entry.name}: {command[:200]}")
    return found


def test_a_job_runs_and_the_cluster_comes_back_at_its_address_after_an_outage(ray_cluster: RayCluster) -> None:
    client = JobSubmissionClient(ray_cluster.address)
    first = client.submit_job(entrypoint=HELLO)
    assert wait_for(client, first, set()) == JobStatus.SUCCEEDED, client.get_job_logs(first)
    assert "hello from ray" in client.get_job_logs(first).splitlines()

    # The outage comes while a job runs: its driver runs in a session of its own, outside the head's.
    marker = f"outage-{uuid.uuid4().hex[:8]}"
    running = client.submit_job(entrypoint=f'python -c "import time; {marker!r}; time.sleep(600)"')
    assert wait_for(client, running, {JobStatus.RUNNING}) == JobStatus.RUNNING
    # RUNNING is said as the driver is started: its process may not be there yet.
    deadline = time.monotonic() + 60
    while not commands_naming(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert commands_naming(marker)
    assert commands_naming(str(ray_cluster.temp_dir))
    address = ray_cluster.address
    ray_cluster.stop()

    assert not ray_cluster.running()
    assert not commands_naming(str(ray_cluster.temp_dir))  # raylet, GCS, dashboard, agents, workers
    assert not commands_naming(marker)  # the job's driver
    assert not ray_cluster.temp_dir.exists()
    with pytest.raises(ConnectionError):  # requests' ConnectionError is an OSError, as the builtin is
        JobSubmissionClient(address)

    ray_cluster.start()
    assert ray_cluster.address == address
    # The client made before the outage works again: it holds nothing but the address.
    second = client.submit_job(entrypoint=HELLO)
    assert wait_for(client, second, set()) == JobStatus.SUCCEEDED, client.get_job_logs(second)
    assert "hello from ray" in client.get_job_logs(second).splitlines()
    # The jobs from before the outage are gone: the GCS keeps them in memory only.
    with pytest.raises(RuntimeError, match="does not exist"):
        client.get_job_status(first)


def test_a_submission_id_is_taken_once(ray_cluster: RayCluster) -> None:
    client = JobSubmissionClient(ray_cluster.address)
    submission_id = f"x-1-{uuid.uuid4().hex[:8]}"  # the cluster is the session's: an id of this test's own
    assert client.submit_job(entrypoint=HELLO, submission_id=submission_id) == submission_id
    with pytest.raises(RuntimeError, match="already exists"):
        client.submit_job(entrypoint=HELLO, submission_id=submission_id)
    assert wait_for(client, submission_id, set()) == JobStatus.SUCCEEDED, client.get_job_logs(submission_id)


def test_a_jobs_tasks_run_this_venvs_python_and_import_this_checkout(ray_cluster: RayCluster, tmp_path: Path) -> None:
    """What a training job on the cluster needs: its Ray tasks import this checkout's `handlers`, in this venv."""
    script = tmp_path / "where.py"
    script.write_text(
        "import sys\n"
        "import ray\n"
        "\n"
        "@ray.remote\n"
        "def where():\n"
        "    import os, handlers\n"
        "    parent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read().split(b'\\0')[0].decode()\n"
        "    return sys.executable, handlers.__file__, os.path.basename(parent)\n"
        "\n"
        "ray.init()\n"
        "print('task:', *ray.get(where.remote()))\n"
    )
    client = JobSubmissionClient(ray_cluster.address)
    job = client.submit_job(entrypoint=f"python {script}")
    assert wait_for(client, job, set()) == JobStatus.SUCCEEDED, client.get_job_logs(job)
    handlers = Path(__file__).parents[2] / "handlers" / "__init__.py"
    # Started by the raylet itself: not through `uv run` (Ray's hook for drivers under `uv run`, as pytest is
    # here), which would sync the venv before each worker.
    assert f"task: {sys.executable} {handlers} raylet" in client.get_job_logs(job).splitlines()


def held(port: int) -> socket.socket:
    """A listening socket on the loopback's `port`, as another process's server would hold it."""
    holder = socket.socket()
    # The head's own connections, just closed, leave the port in TIME_WAIT, which a listener may bind over.
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", port))
    holder.listen()
    return holder


def test_a_head_whose_port_is_taken_starts_on_others_at_first_and_says_why_at_a_restart(tmp_path: Path) -> None:
    """The dashboard's port stands for any of them: `ray start` says at once that it cannot bind it (the GCS's,
    the port of CI's failure, takes Ray 40 s to give up on)."""
    cluster = RayCluster(tmp_path)
    first = cluster.address
    try:
        with held(cluster.ports["--dashboard-port"]):
            cluster.start()
            assert cluster.running()
            assert cluster.address != first
            assert JobSubmissionClient(cluster.address).list_jobs() == []
        address = cluster.address
        cluster.stop()

        with held(cluster.ports["--dashboard-port"]), pytest.raises(RuntimeError, match="already occupied") as error:
            cluster.start()
        assert str(error.value).count("exited before it answered") == 1  # a restart keeps its ports: one try
        assert cluster.address == address
        assert not cluster.running()
        assert not commands_naming(str(cluster.temp_dir))
    finally:
        cluster.stop()
