"""`adapterd jobs --state queued` and `get` on a fleet of several kinds of GPU: the hosts' `accepted` events say their
kinds (`slots_by_kind`), and a request that asks for a kind is placed only on slots of a kind that serves it."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.cli.checks import doctor
from daemon.cli.checks.doctor import _gpus as gpus_check
from daemon.cli.places import place_and_eta, slots_by_kind
from daemon.cli.waiting import combine
from daemon.resources.kinds import host_gpus
from daemon.settings import Settings
from tests.daemon.cli.test_waiting_requests import BATCH, NOW, event, record, settings  # noqa: F401 (the fixture)
from tests.daemon.core.test_gpu_kinds import fake_nvidia_smi
from tests.helpers import sft_request, status_config


def test_an_h100_request_is_placed_on_the_h100_only(settings: Settings, tmp_path: Path) -> None:  # noqa: F811
    # One L4 host and one H100 host, each of one slot, each free again (their jobs ended).
    events = [
        event("accepted", "old-1", 60, host="l4-host", method="sft", host_slots=1, gpu_kind="l4-24gb"),
        event("succeeded", "old-1", 50, host="l4-host"),
        event("accepted", "old-2", 60, host="h100-host", method="sft", host_slots=1, gpu_kind="h100-80gb"),
        event("succeeded", "old-2", 50, host="h100-host"),
    ]
    read = [
        record(BATCH, 0, 3, sft_request("h100-first", resources={"gpu_kind": "h100-80gb"})),
        record(BATCH, 1, 2, sft_request("h100-second", resources={"gpu_kind": "h100-80gb"})),
        record(BATCH, 2, 1, sft_request("any")),
    ]
    backlog = combine(read, events, settings)
    kinds = slots_by_kind(events, NOW, settings)
    assert kinds is not None and kinds.slots == {"l4-24gb": 1, "h100-80gb": 1}
    placed = place_and_eta(backlog.waiting, events, settings, 2, NOW, None, kinds)
    by_kind = {p.request.request_id: p.eta_s for p in placed}
    # `any` takes the L4 now; the second H100 request waits for the first's end (a job's length as those that ended).
    assert by_kind["h100-first"] == 0.0 and by_kind["any"] == 0.0
    assert by_kind["h100-second"] is not None and by_kind["h100-second"] > 0
    # Counted as two slots of no kind, the second H100 request would be told it starts now, on the L4.
    plain = {p.request.request_id: p.eta_s for p in place_and_eta(backlog.waiting, events, settings, 2, NOW)}
    assert plain == {"h100-first": 0.0, "h100-second": 0.0, "any": by_kind["h100-second"]}


def test_status_says_the_hosts_kind_of_gpu(tmp_path: Path) -> None:
    document = {
        "host": "gpu-a",
        "group_id": "adapterd",
        "gpus": ["0"],
        "gpu_kind": "h100-80gb",
        "gpu_memory_gib": 80.0,
        "slots": {"total": 1, "busy": 0, "free": ["0"]},
        "packing": None,
        "jobs": [],
        "children": {},
    }
    with status_config(document, tmp_path) as config:
        result = CliRunner().invoke(app, ["status", "-c", str(config)])
    assert result.exit_code == 0, result.output
    assert (
        result.stdout.splitlines()[0] == "host gpu-a, group adapterd: 0 of 1 slot(s) busy; GPUs h100-80gb, 80 GiB each"
    )


def test_doctor_says_the_hosts_kind_of_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The fake nvidia-smi given to the detection alone, not as the process's PATH: under xdist the worker's other
    # threads see os.environ too (this test once found no nvidia-smi on CI's loaded workers).
    environ = fake_nvidia_smi(tmp_path, "0, NVIDIA L4, 23034")
    monkeypatch.setattr(doctor, "host_gpus", functools.partial(host_gpus, environ=environ))
    check = gpus_check(Settings(gpus=["0"]))
    assert check.ok and check.detail == "1: 0; l4-24gb, 24 GiB each"
    assert gpus_check(Settings(gpus=["0"], gpu_kind="mystery")).detail == "1: 0; mystery, memory unknown"
