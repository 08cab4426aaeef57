"""Estimates of requests' jobs on this host (daemon/jobs/memory.py's model of the memory), read
from their models' safetensors headers, and corrected by what earlier jobs measured
(`MemoryHistory`)."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import structlog
from huggingface_hub import HfApi

from daemon.admission.policy import other_models
from daemon.jobs.journal import write_atomically
from daemon.jobs.memory import Estimate, Tensors, WeightsUnreadable, estimate, local_tensors
from daemon.settings import Settings
from schemas.request import RequestBase

log = structlog.get_logger()


@dataclass
class MemoryHistory:
    """Measured over estimated peaks, by model and method, kept in `path` (JSON) across restarts:
    the next estimate for the same model and method is scaled by the largest ratio seen (never
    below 1: an estimate is only ever raised by what was measured)."""

    path: Path
    ratios: dict[str, list[float]] = field(default_factory=dict)
    KEEP = 20  # the most recent ratios kept per model and method

    @classmethod
    def load(cls, path: Path) -> MemoryHistory:
        try:
            loaded = json.loads(path.read_text())
            ratios = {str(key): [float(value) for value in values][-cls.KEEP:] for key, values in loaded.items()}
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
        del values[:-self.KEEP]
        write_atomically(self.path, self.ratios)


class Estimator:
    """Estimates of requests' jobs on this host: their models' headers read once per model and
    revision (a local folder's files, or the Hub's safetensors metadata), scaled by the history.
    Unknown (None) when a model's headers cannot be read within `READ_TIMEOUT_S` (the scheduler waits
    on it: a Hub that is away must not hold intake), and for `UNKNOWN_FOR_S` after that, for that model:
    such a job takes a whole GPU."""

    READ_TIMEOUT_S = 10.0
    UNKNOWN_FOR_S = 300.0

    def __init__(self, settings: Settings, history: MemoryHistory) -> None:
        self.settings = settings
        self.history = history
        self._tensors: dict[tuple[str, str | None], Tensors] = {}
        self._unknown: dict[tuple[str, str | None], float] = {}  # model and revision → until when it is not asked again

    async def need(self, request: RequestBase, *, gradient_checkpointing: bool = True) -> Estimate | None:
        """The job's estimate (with TRL's default, gradient checkpointing), scaled by the history; None when unknown."""
        try:
            base = await self.tensors(request.model.id, request.model.revision)
            others = [await self.tensors(spec.id, getattr(spec, "revision", None)) for _, spec in other_models(request)]
            found = estimate(request, base, others, gradient_checkpointing=gradient_checkpointing)
            return Estimate(found.parts, found.gradient_checkpointing, self.history.scale(request.model.id, request.method))
        except Exception as exc:  # any reason the headers cannot be read: the job runs on a whole GPU
            log.info("memory.estimate_unknown", request_id=request.request_id, model=request.model.id, error=f"{type(exc).__name__}: {exc}"[:300])
            return None

    def learn(self, request: RequestBase, estimated: Estimate, measured_bytes: int) -> None:
        """What a job measured on a GPU, for the next estimates of its model and method."""
        self.history.learn(request.model.id, request.method, estimated.total, measured_bytes)

    async def tensors(self, model_id: str, revision: str | None) -> Tensors:
        key = (model_id, revision)
        if key not in self._tensors:
            if self._unknown.get(key, 0.0) > time.monotonic():
                raise WeightsUnreadable(f"{model_id}: its headers could not be read a moment ago")
            try:
                async with asyncio.timeout(self.READ_TIMEOUT_S):
                    self._tensors[key] = await asyncio.to_thread(self._read, model_id, revision)
            except Exception:
                self._unknown[key] = time.monotonic() + self.UNKNOWN_FOR_S
                raise
        return self._tensors[key]

    def _read(self, model_id: str, revision: str | None) -> Tensors:
        if model_id.startswith("/"):  # a local model the policy allowed (daemon/admission/policy.py)
            return local_tensors(Path(model_id))
        token = self.settings.hub_token.get_secret_value() if self.settings.hub_token is not None else None
        metadata = HfApi(endpoint=self.settings.hub_endpoint, token=token).get_safetensors_metadata(model_id, revision=revision)
        return Tensors.from_headers(
            {name: {"dtype": info.dtype, "shape": info.shape} for name, info in file.tensors.items()}
            for file in metadata.files_metadata.values()
        )
