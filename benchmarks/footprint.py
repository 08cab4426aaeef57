"""Footprint: the idle daemon's memory (without torch), and what a job leaves behind (nothing)."""

from __future__ import annotations

from benchmarks.harness import Environment, Row, group_members, maps_torch, rss_mib, wait_for_log
from benchmarks.overhead import job
from schemas import Started, Succeeded
from tests.helpers import run_to_end


async def run(env: Environment) -> list[Row]:
    settings = await env.settings(warm_child=False)
    daemon = env.daemon(settings)
    try:
        await wait_for_log(daemon, "partitions.assigned")
        assert daemon.process is not None
        pid = daemon.process.pid
        idle_rss, idle_torch = rss_mib(pid), maps_torch(pid)
        events = await run_to_end(settings, job(env, "footprint", steps=3))
        assert isinstance(events[-1], Succeeded), events[-1]
        child = next(event.pid for event in events if isinstance(event, Started))
        after_rss = rss_mib(pid)
        leftovers = group_members(child)
    finally:
        daemon.stop()
    return [
        Row("footprint", "idle daemon resident memory", round(idle_rss, 1), "MiB", note="parent only" + (", torch MAPPED" if idle_torch else ", no torch mapped")),
        Row("footprint", "daemon resident memory after a job", round(after_rss, 1), "MiB", note=f"{after_rss - idle_rss:+.1f} MiB"),
        Row("footprint", "processes left in the job's process group", len(leftovers), "", "0", note="child exited; host memory returned with it"),
        Row("footprint", "GPU memory after a job", "n/a", "", note="no GPU on this machine; the child holds all CUDA state and exits"),
    ]
