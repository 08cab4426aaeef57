"""GPU discovery and the slot table: lowest free ids first, each job its own GPUs."""

from daemon.job.plan import JobPlace
from daemon.resources.slots import Packing, Placement, Slots, discover_gpus

GIB = 2**30


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
    assert first == Placement(["7"]) and slots.visible_devices(first.slots) == "7" and slots.label(first.slots) == "7"
    pair = slots.take(2)
    assert pair is not None and pair.slots == ["9", "11"] and slots.visible_devices(pair.slots) == "9,11"
    assert slots.take(1) is None and slots.busy == 3
    slots.give_back(pair)
    assert slots.free == ["9", "11"]
    slots.give_back(first)
    assert slots.free == ["7", "9", "11"]


def test_a_host_without_gpus_runs_cpu_slots_and_leaves_cuda_alone() -> None:
    slots = Slots([], cpu_slots=2)
    assert slots.total == 2 and slots.most_per_job() == 1
    taken = slots.take(1)
    assert taken is not None and slots.visible_devices(taken.slots) is None and slots.label(taken.slots) == "cpu"
    assert slots.take(2) is None


def test_without_packing_an_estimate_changes_nothing_every_job_has_a_whole_gpu() -> None:
    slots = Slots(
        ["0", "1"], cpu_slots=1, packing=Packing(80 * GIB, headroom=0.1, max_jobs=1)
    )  # max_jobs 1: today's behaviour
    assert slots.packing is None
    assert (
        slots.take(1, 3 * GIB) == Placement(["0"])
        and slots.take(1, 3 * GIB) == Placement(["1"])
        and slots.take(1, GIB) is None
    )


def test_packing_places_jobs_by_memory_on_the_fullest_gpu_they_fit_and_refuses_when_none_has_room() -> None:
    slots = Slots(["0", "1"], cpu_slots=1, packing=Packing(80 * GIB, headroom=0.1, max_jobs=4))  # 72 GiB usable a GPU
    a = slots.take(1, 30 * GIB)
    assert a == Placement(["0"], 30 * GIB, 0.375)  # its share of the GPU, for torch's per-process fraction
    b = slots.take(1, 30 * GIB)
    assert b is not None and b.slots == ["0"]  # beside a: the fullest GPU it fits on, GPU 1 stays whole
    c = slots.take(1, 30 * GIB)
    assert c is not None and c.slots == ["1"]  # 60 GiB held on GPU 0: 12 left, not 30
    assert slots.take(1, 45 * GIB) is None  # 42 GiB left on GPU 1 and 12 on GPU 0: refused, held until a job ends
    assert slots.take(2) is None  # a two-GPU job needs two whole GPUs
    small = slots.take(1, 10 * GIB)
    assert small is not None and small.slots == ["0"] and slots.reserved("0") == 70 * GIB
    slots.give_back(a)
    assert slots.reserved("0") == 40 * GIB and slots.jobs_on("0") == 2


def test_packing_keeps_at_most_max_jobs_a_gpu_and_whole_gpu_jobs_alone() -> None:
    slots = Slots(["0", "1"], cpu_slots=1, packing=Packing(80 * GIB, headroom=0.1, max_jobs=2))
    assert [slots.take(1, GIB).slots for _ in range(2)] == [["0"], ["0"]]  # type: ignore[union-attr]
    assert slots.free == ["1"]  # GPU 0 holds its most
    alone = slots.take(1, None)  # no estimate (or sent back to run alone): a whole GPU, nothing beside it
    assert alone == Placement(["1"]) and slots.free == [] and slots.take(1, GIB) is None
    too_big = Slots(["0"], cpu_slots=1, packing=Packing(80 * GIB, headroom=0.1, max_jobs=4)).take(1, 75 * GIB)
    assert too_big == Placement(["0"])  # more than a GPU's usable memory: the whole GPU, no fraction to hold it to


def test_a_jobs_place_is_its_label_its_devices_and_only_a_real_share() -> None:
    gpus = Slots(["7", "9"], 1)
    pair = gpus.take(2)
    assert pair is not None and JobPlace.on(gpus, pair) == JobPlace("7,9", "7,9", None)
    shared = Placement(["7"], 30 * GIB, 0.375)  # a share of a packed GPU: its child is held to it
    assert JobPlace.on(gpus, shared).share == shared and JobPlace.on(gpus, shared).share_bytes == 30 * GIB
    cpu = Slots([], 2)
    taken = cpu.take(1)
    assert taken is not None and JobPlace.on(cpu, taken) == JobPlace("cpu") and JobPlace("cpu").share_bytes is None
