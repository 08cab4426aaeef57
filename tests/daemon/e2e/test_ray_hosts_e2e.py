"""A request that names two hosts (`resources.hosts`) on a real local Ray cluster of two nodes (testbed/ray_cluster.py:
each node a raylet of its own on a loopback address of its own, standing in for a host), the real broker, the daemon
as a process, the tiny model and the local Hub. Routing a job across hosts to Ray is tested on the fakes
(tests/daemon/core/test_ray_jobs.py); here is where Ray puts its ranks: either node has room for both (2 CPUs, a
rank's bundle 1), and the request's two hosts put one on each (a placement group's STRICT_SPREAD), which train with
the per-step losses of the same job run on two local ranks."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.job_submission import JobSubmissionClient

from daemon.settings import Settings
from schemas import Started, Succeeded
from testbed.client import submit, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from testbed.ray_cluster import RayCluster
from tests.daemon.e2e.test_ray_e2e import losses, model, on_ray, ray_jobs_of, two_ranks  # noqa: F401 (a fixture)
from tests.handlers.test_sharding import launch_two_ranks, step_losses

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    """A cluster of two nodes, each with CPUs for both of the job's ranks (`num_cpus` 2, a rank's bundle 1)."""
    cluster = RayCluster(tmp_path_factory.mktemp("ray-two"), num_cpus=2, nodes=2)
    cluster.start()
    yield cluster
    cluster.stop()


async def test_a_request_naming_two_hosts_runs_one_rank_on_each_node_and_trains_as_on_two_local_ranks(
    settings: Settings,
    published: HubServer,
    two_nodes: RayCluster,
    model: Path,  # noqa: F811 (the fixture imported)
    tmp_path: Path,
) -> None:
    assert two_nodes.alive_nodes() == 2
    host = on_ray(settings, two_nodes, tmp_path)
    request = {**two_ranks("two-hosts", model, 4), "resources": {"gpus": 2, "hosts": 2}}
    with DaemonProcess(host, tmp_path / "daemon.log"):
        await submit(host, request)
        events = (await terminal_events(host, {"two-hosts"}))["two-hosts"]
    done = events[-1]
    assert isinstance(done, Succeeded), done
    started = next(e for e in events if isinstance(e, Started))
    assert started.child == "ray job adapterd-two-hosts-a1" and started.gpus == 2
    [ray_job] = ray_jobs_of(two_nodes, "two-hosts")
    log = JobSubmissionClient(two_nodes.address).get_job_logs(ray_job.submission_id)
    # Either node had room for both ranks (as PACK, the operator's default, would have placed them): one on each.
    assert "adapterd ray job: 2 ranks on 2 node(s)" in log, log[-2000:]
    assert done.metrics["world_size"] == 2.0
    _, local = launch_two_ranks(request, tmp_path / "local")
    assert list(losses(events).values()) == pytest.approx(step_losses(local), rel=1e-5)
