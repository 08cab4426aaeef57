"""The sharded memory estimate (daemon/resources/memory.py `estimate(shards=N)`) against what two CPU ranks' allocator
held at its peak (testbed/allocator_peak.py, torch's profiler), within the tolerance the one-process estimate meets, and
the testbed's count of gloo's own collective buffers that a GPU (NCCL) would not hold."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from testbed.data import CHAT_ROWS
from tests.helpers import sft_request

# The estimate's tolerance on one process: its per-GPU figure against the allocator peak the job measured. On this CPU
# a full fine-tune of the vocabulary-heavy model below measured 1.14 of its estimate, counting its parameters (the
# estimate models the allocator's peak, torch.cuda.max_memory_allocated on a GPU; on the CPU, torch's profiler counts
# the same bytes but the parameters', below).
ESTIMATE_RTOL = 0.15


def test_the_collectives_own_bytes_at_the_peak_are_what_a_c10d_or_gloo_operation_allocated_and_still_holds() -> None:
    """testbed/allocator_peak.py's `collective_bytes`, on a trace of the profiler's shape: of what is live at the peak,
    the allocations made inside a `c10d::` or `gloo:` operation on the same thread; a gloo copy whose free was never
    recorded stays counted when its address comes back (as the allocator's total keeps it)."""
    from testbed.allocator_peak import allocator_peak, collective_bytes

    def memory(ts: float, tid: int, addr: int, size: int, total: int) -> dict[str, Any]:
        return {
            "name": "[memory]",
            "ph": "i",
            "ts": ts,
            "tid": tid,
            "args": {"Device Type": 0, "Addr": addr, "Bytes": size, "Total Allocated": total},
        }

    trace = {
        "traceEvents": [
            {"name": "c10d::_reduce_scatter_base_", "ph": "X", "ts": 10, "dur": 10, "tid": 1},
            {"name": "gloo:all_gather", "ph": "X", "ts": 13, "dur": 3, "tid": 2},
            {"name": "FSDP::all_gather", "ph": "X", "ts": 29, "dur": 3, "tid": 1},
            memory(12, 1, 0xA, 100, 100),  # the reduce-scatter's clone
            memory(14, 2, 0xC, 7, 107),  # gloo's copy on its thread, freed unrecorded
            memory(22, 1, 0xD, 3, 110),  # the main thread's, outside any collective
            memory(25, 1, 0xC, 7, 117),  # the address back, FSDP2's
            memory(30, 1, 0xB, 50, 167),  # the peak
            memory(40, 1, 0xC, -7, 160),
            memory(41, 1, 0xA, -100, 60),
        ]
    }
    assert allocator_peak(trace) == 167
    assert collective_bytes(trace) == 107


@pytest.mark.slow
def test_the_sharded_estimate_meets_the_one_process_tolerance_against_each_ranks_measured_allocator_peak(
    tmp_path: Path,
) -> None:
    """The per-GPU estimate of a sharded plan (daemon/resources/memory.py `estimate(shards=2)`) against the most each of
    two CPU ranks' allocator held (testbed/allocator_peak.py), within the tolerance the one-process estimate of the same
    job meets against its own. A model whose embedding and logits dominate (the tiny model's figures are TRL's
    chunked-loss buffer, a fixed 64 KiB a token), rows of one length so that every rank's batches are alike.

    What a GPU would hold, counted explicitly, in both runs: on the CPU the parameters are not in the profiler's count
    (loaded from safetensors, their storage is the file's mapping, outside the allocator's total: it holds a few KiB
    when the first step starts), where a GPU copies them into its allocator, so each rank's parameter bytes
    (`rank<r>_param_bytes`) are added; and gloo's own copies held at the peak (testbed/allocator_peak.py's
    `collective_bytes`: now and then its clone of the root's gradient for a reduce-scatter, 32.8 MB, or a layer's
    2.4 MB, still referenced by its work), which NCCL, working in FSDP2's buffers, does not make, are taken off.
    Measured at the peak (in the loss's backward, step 2): AdamW's moments, the loss's buffers, the head's whole
    gradient, and two gathered copies of the tied embedding (the embedding's unit's and the root's); so counted, a
    rank 245.0-247.4 MB, 1.12-1.13 of its estimate (218.0 MB), one process 235.7 MB, 1.14 of its own (206.4 MB).
    Without the gradients before their reduce-scatter, the tied head's second copy and the prefetched block, 1.67."""
    from benchmarks.memory_estimate import build
    from daemon.resources.headers import local_tensors
    from daemon.resources.memory import estimate
    from schemas import RequestBase, decode_request
    from testbed.child_runs import run_child

    model = tmp_path / "model"
    build(
        model,
        {
            "hidden_size": 256,
            "intermediate_size": 512,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
        },
    )
    ratios = {}
    for processes, shard in ((1, "none"), (2, "fsdp")):
        request = sft_request(
            f"peak-{shard}",
            model={"id": str(model), "dtype": "float32"},
            dataset={"rows": [CHAT_ROWS[0]] * 8},
            peft=None,
            sft={"max_length": 64},
            training={"max_steps": 2, "per_device_train_batch_size": 2},
            resources={"gpus": processes, "shard": shard},
        )
        run = run_child(request, tmp_path / shard, processes, allocator=True)
        assert run.result()["metrics"]["world_size"] == processes and sorted(run.allocator_peaks) == list(
            range(processes)
        )
        decoded = decode_request(json.dumps(request).encode())
        assert isinstance(decoded, RequestBase)
        metrics = run.result()["metrics"]
        measured = max(
            peak - run.allocator_collectives[rank] + metrics[f"rank{rank}_param_bytes"]
            for rank, peak in run.allocator_peaks.items()
        )
        ratios[shard] = measured / estimate(decoded, local_tensors(model), shards=processes).total
    assert ratios["none"] == pytest.approx(1.0, abs=ESTIMATE_RTOL), ratios  # the one-process tolerance holds...
    assert ratios["fsdp"] == pytest.approx(1.0, abs=ESTIMATE_RTOL), ratios  # ...and the sharded figure meets it
