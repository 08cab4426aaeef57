"""The child's memory (issue 39, handlers/toolkit/memory.py): the most a job took (`TrainResult.memory`), its share
of a shared GPU (`JobSpec.memory_fraction`, set before CUDA's first allocation), and CUDA out of memory
ending the child with its own failure, `out_of_memory`, retried. The CUDA figures are checked with
torch.cuda's functions replaced by ones that return constructed numbers: which figure goes where, without a GPU."""

from __future__ import annotations

import json
import os
import resource
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from handlers.protocol import Heartbeat, JobSpec, MemoryUse, TrainResult
from handlers.toolkit import reporting
from handlers.toolkit.memory import MemoryWatch, out_of_memory
from handlers.toolkit.reporting import StatusReporter, start_cuda
from testbed.data import CHAT_ROWS
from tests.helpers import run_handler, sft_request

GIB = 2**30
OOM_MESSAGE = (
    "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which 1.06 GiB is free."
)


def tiny_sft(request_id: str, model: Path, **overrides: Any) -> dict[str, Any]:
    return sft_request(
        request_id, model={"id": str(model)}, dataset={"rows": CHAT_ROWS}, sft={"max_length": 64}, **overrides
    )


def test_a_cpu_job_reports_the_peak_resident_set_of_its_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    result, _ = run_handler(tiny_sft("memory-cpu", tiny_model_dir), tmp_path)
    peak_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert isinstance(result, TrainResult), result
    memory = result.memory
    assert memory is not None and memory.device == "cpu"
    assert memory.peak_allocated_bytes is None and memory.peak_reserved_bytes is None
    # This process's peak, in bytes (ru_maxrss is KiB on Linux: a figure left in KiB would be a thousandth of the peak
    # before). Not compared with the resident set read from /proc/self/statm: the kernel keeps that count apart from its
    # peak and may sync them late, so the resident set now can read a few pages above the recorded peak (CI saw
    # 112 KiB).
    assert peak_before <= memory.device_peak_bytes <= peak_after
    assert (
        TrainResult.model_validate_json(result.model_dump_json()).memory == memory
    )  # crosses the status pipe as it is


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    """torch.cuda's memory functions, answering constructed numbers and recording their calls in order."""
    calls: list[tuple[Any, ...]] = []
    used = iter([3 * GIB, 7 * GIB, 5 * GIB, 6 * GIB])  # the device's own figure at each sample: its peak is 7 GiB
    monkeypatch.setattr(
        torch.cuda,
        "set_per_process_memory_fraction",
        lambda fraction, device=None: calls.append(("fraction", fraction, device)),
    )
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "device_memory_used", lambda device=None: next(used))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 4 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 5 * GIB)
    return calls


def test_on_cuda_the_allocator_peaks_and_the_devices_own_peak_go_where_they_belong(
    fake_cuda: list[tuple[Any, ...]],
) -> None:
    read, write = os.pipe()
    reporter = StatusReporter(write)
    reporter.send(Heartbeat(step=0))  # before CUDA starts nothing is sampled (the fork server's `ready`, say)
    device = torch.device("cuda", 0)
    reporter.memory.start(device, 0.25)  # samples 3 GiB
    reporter.send(Heartbeat(step=1))  # 7 GiB: the peak
    reporter.send(Heartbeat(step=2))  # 5 GiB
    use = reporter.memory.use()  # samples 6 GiB, then reads the allocator's peaks
    assert use == MemoryUse(
        device="cuda", peak_allocated_bytes=4 * GIB, peak_reserved_bytes=5 * GIB, device_peak_bytes=7 * GIB
    )
    assert fake_cuda == [("fraction", 0.25, device), ("reset", device)]
    reporter.close()
    os.close(read)


def test_without_nvml_the_devices_figure_is_total_less_free(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: list[tuple[Any, ...]]
) -> None:
    def no_nvml(device: Any = None) -> int:
        raise ModuleNotFoundError("No module named 'pynvml'")

    monkeypatch.setattr(torch.cuda, "device_memory_used", no_nvml)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (30 * GIB, 80 * GIB))  # (free, total)
    watch = MemoryWatch()
    watch.start(torch.device("cuda", 0), None)
    assert watch.use().device_peak_bytes == 50 * GIB
    assert [call[0] for call in fake_cuda] == ["reset"]  # no share asked for: none set


def test_a_sample_that_fails_costs_the_sample_not_the_message(
    monkeypatch: pytest.MonkeyPatch, fake_cuda: list[tuple[Any, ...]]
) -> None:
    def broken(device: Any = None) -> int:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    watch = MemoryWatch()
    watch.start(torch.device("cuda", 0), None)  # 3 GiB
    monkeypatch.setattr(torch.cuda, "device_memory_used", broken)
    monkeypatch.setattr(torch.cuda, "mem_get_info", broken)
    watch.sample()  # the child's error report after a CUDA error still goes out
    assert watch.device_peak == 3 * GIB


@pytest.mark.parametrize("fraction", [0.4, None])
def test_the_share_is_set_on_the_jobs_gpu_before_its_first_allocation_and_only_when_asked(
    fraction: float | None,
    monkeypatch: pytest.MonkeyPatch,
    fake_cuda: list[tuple[Any, ...]],
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)

    class Allocation:
        def add_(self, value: int) -> Allocation:
            return self

    def zeros(*size: int, device: torch.device) -> Allocation:
        fake_cuda.append(("allocate", device))
        return Allocation()

    monkeypatch.setattr(torch, "zeros", zeros)
    monkeypatch.setenv("LOCAL_RANK", "1")  # a worker of a multi-GPU job: its own GPU
    watch = MemoryWatch()
    start_cuda(watch, fraction)
    device = torch.device("cuda", 1)
    shared = [("fraction", fraction, device)] if fraction is not None else []
    assert fake_cuda == [*shared, ("reset", device), ("allocate", device)]
    assert watch.device == device


def test_out_of_memory_is_told_from_other_errors() -> None:
    assert out_of_memory(ValueError("bad"), "train", None) is None
    assert out_of_memory(RuntimeError("CUDA error: device-side assert triggered"), "train", 0.5) is None
    wrapped = RuntimeError("the step failed")
    wrapped.__cause__ = torch.cuda.OutOfMemoryError(OOM_MESSAGE)
    failure = out_of_memory(wrapped, "evaluate", None)
    assert failure is not None and (failure.code, failure.stage, failure.retryable) == (
        "out_of_memory",
        "evaluate",
        True,
    )
    assert "share" not in failure.message


def run_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: dict[str, Any], **job: Any
) -> tuple[int, list[dict[str, Any]]]:
    """`handlers.child.runner.main` in this process, as a warm child runs a job (what only a real child does
    left out: the parent-death signal, the SIGTERM handler): its exit status and its status lines."""
    from handlers.child import runner

    monkeypatch.setattr(runner, "die_with_parent", lambda: None)
    monkeypatch.setattr(signal, "signal", lambda signum, handler: None)
    monkeypatch.chdir(tmp_path)  # the child moves into the job's folder; back afterwards
    spec = tmp_path / "job" / "spec.json"
    spec.parent.mkdir()
    spec.write_text(
        JobSpec(
            request=request,
            checkpoints=tmp_path / "job" / "checkpoints",
            artifact=tmp_path / "job" / "artifact",
            progress_interval_s=0,
            **job,
        ).model_dump_json()
    )
    status = tmp_path / "status.jsonl"
    monkeypatch.setenv("ADAPTERD_STATUS_FD", str(os.open(status, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)))
    monkeypatch.setenv("ADAPTERD_JOB", json.dumps({"spec": str(spec), "log": str(tmp_path / "job.log")}))
    try:
        code = runner.main()
    finally:
        assert StatusReporter.active is not None
        StatusReporter.active.close()
    return code, [json.loads(line) for line in status.read_text().splitlines()]


@pytest.mark.parametrize(
    ("where", "error", "fraction", "stage"),
    [
        ("training_step", torch.cuda.OutOfMemoryError(OOM_MESSAGE), 0.5, "train"),
        (
            "load_causal_lm",
            RuntimeError(OOM_MESSAGE),
            None,
            "load_model",
        ),  # said in a message only, while the base loads
    ],
)
def test_cuda_out_of_memory_ends_the_child_with_its_own_retried_failure_in_its_stage(
    where: str,
    error: Exception,
    fraction: float | None,
    stage: str,
    tiny_model_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trl import SFTTrainer

    def raises(*args: Any, **kwargs: Any) -> Any:
        raise error

    if where == "training_step":
        monkeypatch.setattr(SFTTrainer, "training_step", raises)
    else:
        monkeypatch.setattr("handlers.toolkit.sequence.load_causal_lm", raises)
    code, sent = run_child(tmp_path, monkeypatch, tiny_sft("memory-oom", tiny_model_dir), memory_fraction=fraction)
    assert code == 1
    assert sent[-1]["kind"] == "error" and not any(m["kind"] == "result" for m in sent)
    assert (sent[-1]["code"], sent[-1]["retryable"], sent[-1]["stage"]) == ("out_of_memory", True, stage)
    assert OOM_MESSAGE in sent[-1]["message"]
    share = "share of its GPU (memory_fraction 0.5, 50%)"
    assert (share in sent[-1]["message"]) == (fraction is not None), sent[-1]["message"]


def test_any_other_error_is_still_a_training_error(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trl import SFTTrainer

    def raises(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("CUDA error: device-side assert triggered")

    monkeypatch.setattr(SFTTrainer, "training_step", raises)
    with pytest.raises(RuntimeError, match="device-side assert"):
        run_child(tmp_path, monkeypatch, tiny_sft("memory-other", tiny_model_dir), memory_fraction=0.5)
    sent = [json.loads(line) for line in (tmp_path / "status.jsonl").read_text().splitlines()]
    assert (sent[-1]["kind"], sent[-1]["code"], sent[-1]["retryable"]) == ("error", "training_error", False)


def test_the_reporter_records_nothing_of_cuda_on_a_host_without_it() -> None:
    """The fork server's reporter and a CPU job's: `sample` asks torch.cuda nothing."""
    assert not reporting.torch.cuda.is_available()
    watch = MemoryWatch()
    watch.sample()
    assert watch.device is None and watch.use().device == "cpu"
