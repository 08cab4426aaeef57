"""`python -m testbed.allocator_peak`: a job's child (`handlers.child.runner`, run by its module name as the daemon
starts it) under torch's profiler, which counts the bytes torch's CPU allocator holds, and the most it held: on the
CPU, the figure `torch.cuda.max_memory_allocated` is on a GPU and the memory estimate (daemon/resources/memory.py)
models, which the job's own CPU figure (its peak resident set, the interpreter and the libraries in it) is not.

Run as the child is (alone, or as a torchrun worker); each process writes `rank<r>.json` ({"rank", "peak_bytes",
"collective_bytes", "exit"}) into the folder ADAPTERD_PEAK_DIR names (and, with ADAPTERD_PEAK_TRACE set, its profile
as `rank<r>.trace.json`). For the tests and benchmarks.sharded; the profiler records every
operation, so a job run here is slower than the child alone.

Two things a GPU's figure would not be, measured so that a reader can account for them: the parameters loaded from
safetensors are not in the count (their storage is the file's mapping, outside the allocator's total; a GPU copies
them into its allocator: the job's `rank<r>_param_bytes` say how many), and `collective_bytes` is what of the peak
the collectives' backend allocated itself, inside a `c10d::` or `gloo:` operation, and still held at the peak:
gloo's own copies of the buffers FSDP2 gives it (it keeps a reduce-scatter's, nondeterministically, until its work
is released), which NCCL, working in those buffers, does not make.
"""

from __future__ import annotations

import bisect
import json
import os
import runpy
import tempfile
from pathlib import Path
from typing import Any

from torch.profiler import ProfilerActivity, profile

CPU_DEVICE_TYPE = 0  # the "Device Type" of a CPU allocation in the profiler's trace (c10's DeviceType::CPU)


def allocator_peak(trace: dict[str, Any]) -> int:
    """The most the CPU allocator held (its "Total Allocated" at each allocation and free) in a chrome trace of a
    profile taken with `profile_memory`; 0 when it recorded none. It counts what was allocated while profiling."""
    return max(
        (
            int(event["args"]["Total Allocated"])
            for event in trace.get("traceEvents", [])
            if event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == CPU_DEVICE_TYPE
        ),
        default=0,
    )


def _memory_events(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted(
        (
            event
            for event in trace.get("traceEvents", [])
            if event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == CPU_DEVICE_TYPE
        ),
        key=lambda e: e["ts"],
    )


def collective_bytes(trace: dict[str, Any]) -> int:
    """Of the allocations live at the allocator's peak, the bytes allocated inside a collective of the process group's
    backend (an operation named `c10d::...` or `gloo:...`, on the same thread): the backend's own copies."""
    spans: dict[Any, list[tuple[float, float]]] = {}
    for event in trace.get("traceEvents", []):
        name = event.get("name", "")
        if event.get("ph") == "X" and (name.startswith("c10d::") or name.startswith("gloo:")):
            spans.setdefault(event.get("tid"), []).append((event["ts"], event["ts"] + event.get("dur", 0)))
    merged: dict[Any, tuple[list[float], list[float]]] = {}
    for tid, intervals in spans.items():  # disjoint spans a thread spent in collectives, for a search by time
        starts: list[float] = []
        ends: list[float] = []
        for start, end in sorted(intervals):
            if ends and start <= ends[-1]:
                ends[-1] = max(ends[-1], end)
            else:
                starts.append(start)
                ends.append(end)
        merged[tid] = (starts, ends)

    def in_collective(event: dict[str, Any]) -> bool:
        starts, ends = merged.get(event.get("tid"), ([], []))
        index = bisect.bisect_right(starts, event["ts"]) - 1
        return index >= 0 and event["ts"] <= ends[index]

    # By address, the allocations not yet freed, latest last: gloo frees its copies on its own threads, and some of
    # those frees are never recorded, so an address comes back allocated while the allocator's total still counts it.
    live: dict[Any, list[tuple[int, bool]]] = {}
    best, held = -1, 0
    for event in _memory_events(trace):
        args = event["args"]
        if args["Bytes"] > 0:
            live.setdefault(args["Addr"], []).append((args["Bytes"], in_collective(event)))
        elif live.get(args["Addr"]):
            live[args["Addr"]].pop()
        if args["Total Allocated"] > best:
            best, held = args["Total Allocated"], sum(size for each in live.values() for size, inside in each if inside)
    return held


def main() -> None:
    folder = Path(os.environ["ADAPTERD_PEAK_DIR"])
    code: Any = 0
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as profiler:
        try:
            runpy.run_module("handlers.child.runner", run_name="__main__")
        except SystemExit as exit:  # the runner's exit status, kept for after the figure is written
            code = exit.code
    rank = int(os.environ.get("RANK", "0"))
    with tempfile.TemporaryDirectory() as scratch:
        # ADAPTERD_PEAK_TRACE kept, for a reader asking where the peak is (chrome://tracing or Perfetto open it).
        trace = (
            folder / f"rank{rank}.trace.json" if os.environ.get("ADAPTERD_PEAK_TRACE") else Path(scratch, "trace.json")
        )
        profiler.export_chrome_trace(str(trace))
        recorded = json.loads(trace.read_text())
        peak, collectives = allocator_peak(recorded), collective_bytes(recorded)
    (folder / f"rank{rank}.json").write_text(
        json.dumps({"rank": rank, "peak_bytes": peak, "collective_bytes": collectives, "exit": code})
    )
    raise SystemExit(code)


if __name__ == "__main__":
    main()
