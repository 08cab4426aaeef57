"""Intake refuses a request for GPUs the fleet cannot serve, naming the field (daemon/admission/gpu_kinds.py): a kind
or a memory no kind the operator declared (`gpu_kinds`) has; and, on a fleet without priority classes, where the
host that reads its partition is the one that would run it, a kind this host lacks. With classes, a host leaves such a
request to one that serves it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiokafka import TopicPartition

from daemon.admission.gpu_kinds import HostGpus
from daemon.admission.judge import refusal
from daemon.resources.slots import Slots
from daemon.settings import Settings
from daemon.settings.fleet import PriorityClass
from schemas import RequestBase, decode_request
from schemas.signing import new_key_pair
from tests.core import CoreOnFakes
from tests.fakes import FakeProducer, FakeRecord
from tests.helpers import sft_request

FLEET = {"a100-40gb": 40.0, "h100-80gb": 80.0, "l4-24gb": 24.0}
L4 = HostGpus("l4-24gb", 24.0, True)


def request(**resources: Any) -> RequestBase:
    decoded = decode_request(json.dumps(sft_request("kinds-1", resources=resources)).encode())
    assert isinstance(decoded, RequestBase), decoded
    return decoded


def paths(request: RequestBase, settings: Settings, kind: HostGpus = L4) -> list[tuple[str, str]]:
    refused = refusal(request, settings, Slots(["0"], 1, kind=kind))
    return [] if refused is None else [(refused.reason, error.path) for error in refused.errors]


def test_a_kind_or_memory_no_kind_of_the_fleet_has_is_refused_naming_the_field() -> None:
    fleet = Settings(gpu_kinds=FLEET, gpus=["0"])
    assert paths(request(gpu_kind="b200-180gb"), fleet) == [("resources", "resources.gpu_kind")]
    assert paths(request(min_gpu_memory_gib=96), fleet) == [("resources", "resources.min_gpu_memory_gib")]
    # The kinds it accepts are there, but none of them has the memory.
    assert paths(request(gpu_kind=["l4-24gb", "a100-40gb"], min_gpu_memory_gib=48), fleet) == [
        ("resources", "resources.min_gpu_memory_gib")
    ]
    refused = refusal(request(gpu_kind="b200-180gb"), fleet, Slots(["0"], 1, kind=L4))
    assert refused is not None
    assert refused.errors[0].message == (
        "b200-180gb: no GPU of this fleet is of that kind; it has a100-40gb (40 GiB), h100-80gb (80 GiB), "
        "l4-24gb (24 GiB)"
    )


def test_without_classes_a_host_refuses_what_its_own_gpus_do_not_serve(tmp_path: Path) -> None:
    fleet = Settings(gpu_kinds=FLEET, gpus=["0"])
    assert paths(request(gpu_kind="h100-80gb"), fleet) == [("resources", "resources.gpu_kind")]
    assert paths(request(min_gpu_memory_gib=40), fleet) == [("resources", "resources.min_gpu_memory_gib")]
    assert paths(request(gpu_kind=["l4-24gb", "h100-80gb"]), fleet) == []  # one of them is this host's
    assert paths(request(min_gpu_memory_gib=24), fleet) == []
    assert paths(request(gpu_kind="l4-24gb"), Settings(gpus=[]), HostGpus()) == [("resources", "resources.gpu_kind")]
    cpu = refusal(request(min_gpu_memory_gib=8), Settings(gpus=[]), Slots([], 1))
    assert cpu is not None and cpu.errors[0].path == "resources.min_gpu_memory_gib"
    assert cpu.errors[0].message.startswith("not served by this host (no GPU)")
    refused = refusal(request(gpu_kind="h100-80gb"), fleet, Slots(["0"], 1, kind=L4))
    assert refused is not None
    assert refused.errors[0].message.startswith("not served by this host (l4-24gb, 24 GiB each), and without priority")
    assert "needs priority_classes" in refused.errors[0].message
    # With classes, a host that cannot serve it does not refuse it: a host that can claims it.
    key = tmp_path / "key.pem"
    key.write_bytes(new_key_pair()[0])
    classes = Settings(
        gpu_kinds=FLEET, gpus=["0"], priority_classes=[PriorityClass(name="batch")], event_signing_key_file=key
    )
    assert paths(request(gpu_kind="h100-80gb"), classes) == []
    assert paths(request(gpu_kind="b200-180gb"), classes) == [("resources", "resources.gpu_kind")]


async def test_intake_rejects_it_with_an_event_naming_the_field(tmp_path: Path) -> None:
    settings = Settings(gpus=["0"], gpu_kind="l4-24gb", warm_child=False, work_dir=tmp_path / "work")
    core = CoreOnFakes(settings, FakeProducer())
    tp = TopicPartition(settings.requests_topic, 0)
    body = json.dumps(sft_request("wants-h100", resources={"gpu_kind": "h100-80gb"})).encode()
    await core.intake.take(tp, [FakeRecord(tp.topic, tp.partition, 0, b"wants-h100", body)])
    await core.partitions.settled(tp)
    [event] = core.events("wants-h100")
    assert event["type"] == "rejected" and event["reason"] == "resources"
    assert [error["path"] for error in event["errors"]] == ["resources.gpu_kind"]  # type: ignore[union-attr,index]
