"""Footprint: the idle daemon's memory (without torch), and what a job leaves behind (nothing)."""

from __future__ import annotations

import asyncio
import time

from benchmarks.harness import (
    Environment,
    Row,
    cpu_seconds,
    group_members,
    maps_torch,
    rss_mib,
    wait_for_log,
)
from benchmarks.overhead import job
from schemas import Started, Succeeded
from testbed.client import submit, terminal_events


async def run(env: Environment) -> list[Row]:
    settings = await env.settings(warm_child=False)
    daemon = env.daemon(settings)
    try:
        await wait_for_log(daemon, "partitions.assigned")
        assert daemon.process is not None
        pid = daemon.process.pid
        idle_rss, idle_torch = rss_mib(pid), maps_torch(pid)
        await submit(settings, job(env, "footprint", steps=150))
        await wait_for_log(daemon, "job.stage", after=2)  # the child is past loading: training
        cpu_before, clock_before = cpu_seconds(pid), time.monotonic()
        await asyncio.sleep(5)  # a sampling window, not synchronisation
        parent_cpu = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - clock_before)
        events = (await terminal_events(settings, {"footprint"}))["footprint"]
        assert isinstance(events[-1], Succeeded), events[-1]
        child = next(event.pid for event in events if isinstance(event, Started))
        after_rss = rss_mib(pid)
        leftovers = group_members(child)
    finally:
        daemon.stop()
    return [
        Row(
            "footprint",
            "idle daemon resident memory",
            round(idle_rss, 1),
            "MiB",
            note="parent only" + (", torch MAPPED" if idle_torch else ", no torch mapped"),
        ),
        Row(
            "footprint",
            "daemon parent CPU while a job trains",
            round(100 * parent_cpu, 2),
            "% of a core",
            note="5 s sample",
        ),
        Row(
            "footprint",
            "daemon resident memory after a job",
            round(after_rss, 1),
            "MiB",
            note=f"{after_rss - idle_rss:+.1f} MiB",
        ),
        Row(
            "footprint",
            "processes left in the job's process group",
            len(leftovers),
            "",
            "0",
            note="child exited; host memory returned with it",
        ),
        Row(
            "footprint",
            "GPU memory after a job",
            "n/a",
            "",
            note="no GPU on this machine; the child holds all CUDA state and exits",
        ),
    ]
