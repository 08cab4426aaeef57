"""`python -m testbed.allocator_peak`: a job's child (`handlers.child.runner`, run by its module name as the daemon
starts it) under torch's profiler, which counts the bytes torch's CPU allocator holds, and the most it held: on the
CPU, the figure `torch.cuda.max_memory_allocated` is on a GPU and the memory estimate (daemon/jobs/memory.py)
models, which the job's own CPU figure (its peak resident set, the interpreter and the libraries in it) is not.

Run as the child is (alone, or as a torchrun worker); each process writes `rank<r>.json` ({"rank", "peak_bytes",
"exit"}) into the folder ADAPTERD_PEAK_DIR names (and, with ADAPTERD_PEAK_TRACE set, its profile as `rank<r>.trace.json`). For the tests and benchmarks.sharded; the profiler records every
operation, so a job run here is slower than the child alone.
"""

from __future__ import annotations

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
    return max((int(event["args"]["Total Allocated"]) for event in trace.get("traceEvents", [])
                if event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == CPU_DEVICE_TYPE), default=0)


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
        trace = folder / f"rank{rank}.trace.json" if os.environ.get("ADAPTERD_PEAK_TRACE") else Path(scratch, "trace.json")
        profiler.export_chrome_trace(str(trace))
        peak = allocator_peak(json.loads(trace.read_text()))
    (folder / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "peak_bytes": peak, "exit": code}))
    raise SystemExit(code)


if __name__ == "__main__":
    main()
