"""Estimates of requests' jobs on this host (daemon/resources/memory.py's model of the memory), read
from their models' safetensors headers, and corrected by what earlier jobs measured
(`MemoryHistory`)."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path

import structlog

from daemon import executors
from daemon.admission.policy import other_models
from daemon.resources.headers import Deadline, HubModel, local_files, read_header
from daemon.resources.memory import Estimate, Tensors, estimate
from daemon.settings import Settings
from daemon.store.journal import write_atomically
from schemas.request import RequestBase

log = structlog.get_logger()


@dataclass
class MemoryHistory:
    """Measured over estimated peaks, by model and method, kept in `path` (JSON) across restarts:
    the next estimate for the same model and method is scaled by the largest ratio seen (never
    below 1: an estimate is only ever raised by what was measured). The largest, so one sample moves
    it: only jobs that ran with the settings their estimate assumed are taught to it
    (daemon/job/memory.py `ran_as_estimated`)."""

    path: Path
    ratios: dict[str, list[float]] = field(default_factory=dict)
    KEEP = 20  # the most recent ratios kept per model and method

    @classmethod
    def load(cls, path: Path) -> MemoryHistory:
        try:
            loaded = json.loads(path.read_text())
            # Only ratios a job could have measured: a file edited to say Infinity or -1 scales nothing.
            ratios = {
                str(key): [ratio for ratio in map(float, values) if math.isfinite(ratio) and 0 < ratio < 1000][
                    -cls.KEEP :
                ]
                for key, values in loaded.items()
            }
        except (FileNotFoundError, ValueError, TypeError, AttributeError):
            ratios = {}
        return cls(path, ratios)

    @staticmethod
    def key(model_id: str, method: str) -> str:
        return f"{model_id}|{method}"

    def scale(self, model_id: str, method: str) -> float:
        return max([1.0, *self.ratios.get(self.key(model_id, method), [])])

    def learn(self, model_id: str, method: str, estimated: int, measured: int) -> None:
        if estimated <= 0 or measured <= 0:
            return
        values = self.ratios.setdefault(self.key(model_id, method), [])
        values.append(round(measured / estimated, 4))
        del values[: -self.KEEP]
        write_atomically(self.path, self.ratios)


Key = tuple[str, str | None]  # a model and its revision


class Estimator:
    """Estimates of requests' jobs on this host: their models' headers read once per model and
    revision (a local folder's files, or the Hub's), scaled by the history.

    `known` answers at once, from what was read before: the scheduler's offer asks it on the event
    loop. `need` reads what is missing, every model of the request at once, all within one deadline
    (`DEADLINE_S`) in the `headers` pool's threads (daemon/resources/headers.py: reads that end by it); the
    scheduler runs it beside the loop (daemon/resources/estimates.py). A model whose headers could not be
    read in time, or say no model (a negative dimension), is unknown for `UNKNOWN_FOR_S`: a job of it
    takes a whole GPU. `KEEP_MODELS` models' tensors are kept, the least recently used let go."""

    DEADLINE_S = 10.0
    UNKNOWN_FOR_S = 300.0
    KEEP_MODELS = 64

    def __init__(self, settings: Settings, history: MemoryHistory) -> None:
        self.settings = settings
        self.history = history
        self._tensors: OrderedDict[Key, Tensors] = OrderedDict()
        self._unknown: dict[Key, float] = {}  # model and revision → until when it is not asked again
        self._reading: dict[Key, asyncio.Task[None]] = {}  # one read of a model at a time, whoever asks

    @staticmethod
    def models(request: RequestBase) -> list[Key]:
        """The models a request's job loads: its base first."""
        return [
            (request.model.id, request.model.revision),
            *((spec.id, spec.revision) for _, spec in other_models(request)),
        ]

    def known(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> tuple[bool, Estimate | None]:
        """(True, the estimate) when every model of the request was read before, (True, None) when one
        is unknown, (False, None) when one must be read first (`need`). Quick: no read, no wait. With
        `shards` above 1: one GPU's figure with the base sharded across that many (daemon/resources/memory.py)."""
        now = time.monotonic()
        keys = self.models(request)
        if any(key not in self._tensors and self._unknown.get(key, 0.0) <= now for key in keys):
            return False, None
        if any(key not in self._tensors for key in keys):
            log.info(
                "memory.estimate_unknown",
                request_id=request.request_id,
                model=request.model.id,
                error="its headers could not be read a moment ago",
            )
            return True, None
        for key in keys:
            self._tensors.move_to_end(key)
        try:
            base, *others = (self._tensors[key] for key in keys)
            found = estimate(request, base, others, gradient_checkpointing=gradient_checkpointing, shards=shards)
        except Exception as exc:  # WeightsUnreadable (no embedding), or a bug: the job takes a whole GPU
            log.info(
                "memory.estimate_unknown", request_id=request.request_id, model=request.model.id, error=str(exc)[:300]
            )
            return True, None
        return True, replace(found, scale=self.history.scale(request.model.id, request.method))

    async def need(
        self, request: RequestBase, *, gradient_checkpointing: bool = True, shards: int = 1
    ) -> Estimate | None:
        """The job's estimate (with TRL's default, gradient checkpointing; on one of `shards` GPUs), scaled by the
        history; None when unknown. Its models' headers are read first where they are not known, within DEADLINE_S."""
        ready, found = self.known(request, gradient_checkpointing=gradient_checkpointing, shards=shards)
        if ready:
            return found
        deadline = Deadline.after(self.DEADLINE_S)
        reads = [self._read_once(key, deadline) for key in dict.fromkeys(self.models(request))]
        try:
            async with asyncio.timeout(self.DEADLINE_S):
                await asyncio.gather(*(asyncio.shield(read) for read in reads))
        except Exception as exc:  # any reason the headers cannot be read: the job runs on a whole GPU
            said = (
                f"not read within {self.DEADLINE_S:g} s"
                if isinstance(exc, TimeoutError)
                else f"{type(exc).__name__}: {exc}"
            )
            log.info("memory.estimate_unknown", request_id=request.request_id, model=request.model.id, error=said[:300])
            return None
        return self.known(request, gradient_checkpointing=gradient_checkpointing, shards=shards)[1]

    def learn(self, request: RequestBase, estimated: Estimate, measured_bytes: int) -> None:
        """What a job measured on a GPU, for the next estimates of its model and method."""
        self.history.learn(request.model.id, request.method, estimated.total, measured_bytes)

    def _read_once(self, key: Key, deadline: Deadline) -> asyncio.Task[None]:
        """The read of `key` in flight (started now, with `deadline`, unless one is); done at once
        when it is known or unknown already."""
        if key not in self._reading:
            task = self._reading[key] = asyncio.create_task(self._keep(key, deadline), name=f"headers-{key[0]}"[:100])
            # Its failure is said by `need` (logged once); when every asker has stopped waiting, nobody
            # retrieves it: retrieved here, so asyncio does not report it as lost.
            task.add_done_callback(lambda done: done.cancelled() or done.exception())
        return self._reading[key]

    async def _keep(self, key: Key, deadline: Deadline) -> None:
        try:
            if key in self._tensors or self._unknown.get(key, 0.0) > time.monotonic():
                return
            try:
                async with asyncio.timeout(max(0.0, deadline.at - time.monotonic())):
                    tensors = await self.read(*key, deadline)
            except BaseException:
                now = time.monotonic()
                self._unknown = {other: until for other, until in self._unknown.items() if until > now}
                self._unknown[key] = now + self.UNKNOWN_FOR_S
                raise
            self._tensors[key] = tensors
            while len(self._tensors) > self.KEEP_MODELS:
                self._tensors.popitem(last=False)
        finally:
            del self._reading[key]

    async def read(self, model_id: str, revision: str | None, deadline: Deadline) -> Tensors:
        """A model's tensors from its headers, every file read at once in the `headers` pool."""
        if model_id.startswith("/"):  # a local model the policy allowed (daemon/admission/policy.py)
            files = await executors.run("headers", local_files, Path(model_id))
            headers = await asyncio.gather(*(executors.run("headers", read_header, path, deadline) for path in files))
        else:
            token = self.settings.hub_token.get_secret_value() if self.settings.hub_token is not None else None
            model = HubModel(self.settings.hub_endpoint, model_id, revision, token)
            found = await executors.run("headers", model.single_or_shards, deadline)
            headers = (
                [found]
                if isinstance(found, dict)
                else list(
                    await asyncio.gather(*(executors.run("headers", model.header, shard, deadline) for shard in found))
                )
            )
        return await executors.run("headers", lambda: Tensors.from_headers(headers).warm())
