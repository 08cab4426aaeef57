"""The fleet with priority classes and a Ray cluster (`[ray]`): a host's dispatcher claims a request bigger than
itself for a free Ray slot of its own, in the fleet's order, beside what its GPUs take, and no more of them than it
supervises at once (`ray.max_jobs`). On the fakes."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.settings import Settings
from tests.core import CoreOnFakes
from tests.daemon.fleet.test_fleet_kinds import record
from tests.daemon.fleet.test_queue_dispatch import Moves, fleet_settings, turns  # noqa: F401 (a fixture)


@pytest.fixture
def ray_host(fleet_settings: Settings, tmp_path: Path) -> Settings:  # noqa: F811 (the fixture above)
    ray = {"address": "http://ray-head:8265", "shared_dir": str(tmp_path / "shared"), "max_gpus": 8}
    return Settings.model_validate({**fleet_settings.model_dump(), "gpus": ["0"], "ray": ray})


async def test_a_host_claims_a_request_bigger_than_itself_for_its_ray_slot_beside_one_for_its_gpu(
    ray_host: Settings,
) -> None:
    # Two bigger than the host (4 GPUs; it has one) ahead of one that fits its GPU.
    records = [record(0, "big-1", gpus=4), record(1, "big-2", gpus=4), record(2, "small", gpus=1)]
    core = CoreOnFakes(ray_host)
    dispatcher = core.fleet_host(3, records)  # claims partitions enough for every request: its slots decide
    mover = Moves(core.fleet, dispatcher.mover.seal)
    await turns(dispatcher, lambda: len(mover.claims()) == 2)
    for _ in range(5):
        await dispatcher.turn()
    # The first big one for its one Ray slot (ray.max_jobs), the small one for its GPU; big-2 waits for a Ray slot.
    assert sorted(key for key, _ in mover.claims()) == ["big-1", "small"]
    assert not [e for e in core.events() if e["type"] == "rejected"]
