"""Each rank's own figures in a job of several processes (data-parallel or sharded, one worker per GPU): the
tokens its batches carried and its peak memory, gathered to rank 0, the only rank the daemon hears
(handlers/child/runner.py `status_fd`), for the `progress` and `succeeded` events.

Every function here that gathers is a collective: every rank calls it at the same point of the job, or the
ranks that did wait for ever on the ones that did not.
"""

from __future__ import annotations

from typing import Any

import torch

from handlers.protocol import MemoryUse


def world_size() -> int:
    """The job's processes: 1 outside a process group."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return int(torch.distributed.get_world_size())
    return 1


def gather(values: list[float], device: torch.device | str = "cpu") -> list[list[float]]:
    """`values` of every rank, by rank (a collective; this rank's alone outside a job of several). `device` is
    where the collective's tensors live: the rank's GPU under NCCL, the CPU under gloo."""
    if world_size() == 1:
        return [values]
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    ranks = [torch.zeros_like(mine) for _ in range(world_size())]
    torch.distributed.all_gather(ranks, mine)
    return [rank.tolist() for rank in ranks]


def leave() -> None:
    """End this process's part in the job's process group, once every rank is here: a worker that exits with its
    group alive may abort at exit as gloo's threads are torn down (seen: `terminate called without an active
    exception`, SIGABRT after a job had succeeded), and the launcher then reports the job failed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def peak_bytes(use: MemoryUse) -> int:
    """One figure of a rank's memory: torch's allocator peak on its GPU, or on the CPU its peak resident set."""
    return use.peak_allocated_bytes if use.peak_allocated_bytes is not None else use.device_peak_bytes


def largest(use: MemoryUse) -> tuple[MemoryUse, dict[str, float]]:
    """The memory of the rank that took the most (what a job of several GPUs needs of each), and each rank's peak
    for the `succeeded` metrics, `rank<r>_peak_bytes` (a collective; this rank's alone outside a job of several)."""
    if world_size() == 1:
        return use, {}
    ranks: list[Any] = [None] * world_size()
    torch.distributed.all_gather_object(ranks, use.model_dump())
    uses = [MemoryUse.model_validate(rank) for rank in ranks]
    return max(uses, key=peak_bytes), {
        f"rank{rank}_peak_bytes": float(peak_bytes(each)) for rank, each in enumerate(uses)
    }


class TokenCount:
    """The tokens of this rank's own training batches, counted as they enter the model (a forward pre-hook on the
    trainer's model): the non-padding tokens where the batch has an attention mask, else every input id. TRL's
    `num_tokens` is the whole job's (gathered over the ranks), so it cannot say what one rank trained on. A mask's
    count stays on its device until read (`tokens`, at a log), so a GPU's step is not made to wait for it."""

    def __init__(self) -> None:
        self._counted: torch.Tensor | int = 0
        self._handle: Any = None

    @property
    def tokens(self) -> int:
        return int(self._counted.item()) if isinstance(self._counted, torch.Tensor) else self._counted

    def attach(self, model: torch.nn.Module) -> None:
        if self._handle is None:
            self._handle = model.register_forward_pre_hook(self._count, with_kwargs=True)

    def _count(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not module.training:
            return  # an evaluation's batches are not training's
        mask, ids = kwargs.get("attention_mask"), kwargs.get("input_ids", args[0] if args else None)
        if (
            isinstance(mask, torch.Tensor) and mask.dim() == 2
        ):  # (batch, sequence) of 1s and 0s; a 4-D mask is not a count
            self._counted = self._counted + mask.detach().sum()
        elif isinstance(ids, torch.Tensor):
            self._counted = self._counted + ids.numel()
