"""Which source a job's child comes from: this host's (`WarmChildren`), or the Ray cluster's (`RayChildSource`) for
a job the scheduler placed there (`ChildJob.engine`). One `ChildSource` to the jobs, so they know of neither."""

from __future__ import annotations

from daemon.children.processes import ChildHandle, ChildJob, ChildSource


class RoutedChildren:
    def __init__(self, local: ChildSource, ray: ChildSource) -> None:
        self.local = local
        self.ray = ray

    async def prepare(self, wanted: list[str | None]) -> None:
        await self.local.prepare(wanted)  # warm children are this host's alone

    async def start(self, job: ChildJob) -> ChildHandle:
        return await (self.ray if job.engine == "ray" else self.local).start(job)

    async def close(self) -> None:
        await self.local.close()
        await self.ray.close()
