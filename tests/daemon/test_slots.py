"""GPU discovery and the slot table: lowest free ids first, each job its own GPUs."""

from daemon.jobs.slots import Slots, discover_gpus


def test_configured_gpus_win_over_the_environment() -> None:
    assert discover_gpus(["3", "5"], {"CUDA_VISIBLE_DEVICES": "0,1"}) == ["3", "5"]
    assert discover_gpus([], {"CUDA_VISIBLE_DEVICES": "0,1"}) == []


def test_cuda_visible_devices_is_the_hosts_list_when_nothing_is_configured() -> None:
    assert discover_gpus(None, {"CUDA_VISIBLE_DEVICES": "2, 3"}) == ["2", "3"]
    assert discover_gpus(None, {"CUDA_VISIBLE_DEVICES": "-1"}) == []


def test_gpu_slots_are_taken_lowest_first_and_given_back() -> None:
    slots = Slots(["7", "9", "11"], cpu_slots=1)
    assert slots.total == 3 and slots.most_per_job() == 3
    first = slots.take(1)
    assert first == ["7"] and slots.visible_devices(first) == "7" and slots.label(first) == "7"
    pair = slots.take(2)
    assert pair == ["9", "11"] and slots.visible_devices(pair) == "9,11"
    assert slots.take(1) is None and slots.busy == 3
    slots.give_back(pair)
    assert slots.free == ["9", "11"]
    slots.give_back(first)
    assert slots.free == ["7", "9", "11"]


def test_a_host_without_gpus_runs_cpu_slots_and_leaves_cuda_alone() -> None:
    slots = Slots([], cpu_slots=2)
    assert slots.total == 2 and slots.most_per_job() == 1
    taken = slots.take(1)
    assert taken is not None and slots.visible_devices(taken) is None and slots.label(taken) == "cpu"
    assert slots.take(2) is None
