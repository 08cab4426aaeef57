"""A job's memory beside its lifecycle (daemon/job/memory.py), without a scheduler or a child:
the speed settings its estimate allows, and the memory its `succeeded` reports and the estimator learns from."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from daemon.job.memory import fast_settings, reported_memory
from daemon.resources.memory import Estimate
from daemon.resources.slots import Placement
from daemon.settings import Settings
from handlers.protocol import FastSettings, MemoryUse
from schemas import REQUEST_MODELS, RequestBase
from tests.helpers import sft_request

GIB = 2**30


class Needs:
    """The estimator's seam: one need without gradient checkpointing, and what it was taught."""

    def __init__(self, lean: int | None) -> None:
        self.lean = lean
        self.asked: list[bool] = []
        self.learned: list[tuple[str, int, int]] = []

    async def need(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> Estimate | None:
        self.asked.append(gradient_checkpointing)
        return (
            None
            if self.lean is None
            else Estimate({"weights": self.lean}, gradient_checkpointing=gradient_checkpointing)
        )

    def learn(self, request: RequestBase, estimated: Estimate, measured_bytes: int) -> None:
        self.learned.append((request.request_id, estimated.total, measured_bytes))


def request(request_id: str = "r1", **training: object) -> RequestBase:
    body = sft_request(request_id)
    return REQUEST_MODELS["sft"].model_validate({**body, "training": {**body["training"], **training}})


def host(tmp_path: Path, **overrides: object) -> Settings:
    return Settings(work_dir=tmp_path, hub_token=None, **overrides)  # type: ignore[arg-type]


@pytest.mark.parametrize(("lean_gib", "needed"), [(50, False), (100, True)])
async def test_checkpointing_goes_off_only_where_the_lean_estimate_fits_the_whole_gpu(
    tmp_path: Path, lean_gib: int, needed: bool
) -> None:
    needs = Needs(lean_gib * GIB)
    with capture_logs() as logs:
        fast = await fast_settings(
            request(),
            host(tmp_path, gradient_checkpointing_when_needed=True),
            None,
            72 * GIB,
            needs,  # type: ignore[arg-type]
            structlog.get_logger(),
        )
    assert fast.gradient_checkpointing is needed and needs.asked == [False]  # asked for the estimate without it
    assert [(entry["event"], entry["needed"], entry["estimate_without"]) for entry in logs] == [
        ("job.checkpointing", needed, lean_gib * GIB)
    ]


@pytest.mark.parametrize("case", ["switched off", "shared GPU", "room unknown", "estimate unknown"])
async def test_checkpointing_stays_trls_unless_the_host_asks_and_the_job_has_a_whole_gpu_of_known_room(
    tmp_path: Path, case: str
) -> None:
    needs = Needs(None if case == "estimate unknown" else GIB)
    settings = host(tmp_path, gradient_checkpointing_when_needed=case != "switched off")
    share = Placement(["0"], share_bytes=10 * GIB, fraction=0.125) if case == "shared GPU" else None
    room = None if case == "room unknown" else 72 * GIB
    fast = await fast_settings(request(), settings, share, room, needs, structlog.get_logger())  # type: ignore[arg-type]
    assert fast.gradient_checkpointing is None
    assert needs.asked == ([False] if case == "estimate unknown" else [])


async def test_the_hosts_attention_and_liger_settings_go_to_the_child_as_asked(tmp_path: Path) -> None:
    plain = await fast_settings(request(), host(tmp_path), None, None, None, structlog.get_logger())
    fastest = await fast_settings(
        request(), host(tmp_path, fastest_attention=True, liger_kernel=True), None, None, None, structlog.get_logger()
    )
    assert (plain.attn_implementation, plain.use_liger_kernel) == (None, None)
    assert (fastest.attn_implementation, fastest.use_liger_kernel) == ("flash_attention_2", True)


def test_a_gpu_peak_is_reported_beside_the_estimate_and_share_and_taught_to_the_estimator() -> None:
    needs = Needs(None)
    estimate = Estimate({"weights": 8 * GIB}, gradient_checkpointing=True, scale=1.25)
    share = Placement(["0"], share_bytes=12 * GIB, fraction=0.15)
    measured = MemoryUse(
        device="cuda", peak_allocated_bytes=9 * GIB, peak_reserved_bytes=10 * GIB, device_peak_bytes=11 * GIB
    )
    ratios = REGISTRY.get_sample_value("adapterd_job_memory_estimate_ratio_count", {"method": "sft"}) or 0.0
    memory = reported_memory(request("r7"), estimate, share, measured, needs, FastSettings())  # type: ignore[arg-type]
    assert memory.model_dump() == {
        "estimate_bytes": 10 * GIB,
        "share_bytes": 12 * GIB,
        "device": "cuda",
        "peak_allocated_bytes": 9 * GIB,
        "device_peak_bytes": 11 * GIB,
    }
    assert needs.learned == [
        ("r7", 8 * GIB, 9 * GIB)
    ]  # the model's figure before the scale, against the allocator's peak
    assert REGISTRY.get_sample_value("adapterd_job_memory_estimate_ratio_count", {"method": "sft"}) == ratios + 1


def test_a_cpu_peak_or_no_measure_teaches_the_estimator_nothing() -> None:
    needs = Needs(None)
    estimate = Estimate({"weights": GIB}, gradient_checkpointing=True)
    on_cpu = MemoryUse(device="cpu", peak_allocated_bytes=None, peak_reserved_bytes=None, device_peak_bytes=3 * GIB)
    cpu = reported_memory(request(), estimate, None, on_cpu, needs)  # type: ignore[arg-type]
    unmeasured = reported_memory(request(), None, None, None, needs)  # type: ignore[arg-type]
    assert (cpu.device, cpu.peak_allocated_bytes, cpu.device_peak_bytes, cpu.share_bytes) == (
        "cpu",
        None,
        3 * GIB,
        None,
    )
    assert unmeasured.model_dump() == {
        "estimate_bytes": None,
        "share_bytes": None,
        "device": None,
        "peak_allocated_bytes": None,
        "device_peak_bytes": None,
    }
    assert needs.learned == []


@pytest.mark.parametrize(
    ("training", "fast", "learnt"),
    [
        ({}, FastSettings(), True),  # TRL's default turns checkpointing on, as the estimate assumed
        ({"activation_checkpointing": True}, FastSettings(), True),
        (
            {"activation_checkpointing": False},
            FastSettings(),
            False,
        ),  # the hostile sample: its own setting, not the model's error
        ({"gradient_checkpointing": False}, FastSettings(), False),  # the deprecated alias
        (
            {"activation_checkpointing_kwargs": {"every_n_layers": 4}},
            FastSettings(),
            False,
        ),  # memory the estimate does not model
        ({}, FastSettings(gradient_checkpointing=False), False),  # the host turned it off: the estimate assumed it on
        ({}, None, False),  # a result read back from an earlier attempt: how it ran is not known
    ],
)
def test_only_a_job_that_ran_with_the_checkpointing_its_estimate_assumed_teaches_the_history(
    training: dict[str, object],
    fast: FastSettings | None,
    learnt: bool,
) -> None:
    needs = Needs(None)
    estimate = Estimate({"weights": 17 * GIB}, gradient_checkpointing=True)
    measured = MemoryUse(
        device="cuda", peak_allocated_bytes=34 * GIB, peak_reserved_bytes=35 * GIB, device_peak_bytes=36 * GIB
    )
    reported = reported_memory(request("r1", **training), estimate, None, measured, needs, fast)  # type: ignore[arg-type]
    assert reported.peak_allocated_bytes == 34 * GIB  # reported all the same
    assert needs.learned == ([("r1", 17 * GIB, 34 * GIB)] if learnt else [])
