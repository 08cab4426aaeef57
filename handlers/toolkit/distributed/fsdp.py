"""Sharded training across a job's processes (`resources.shard: fsdp`): FSDP2 full-shard, applied as the
model loads, and what each rank holds of the model.

The seam: the child loads the base through transformers' own distributed loading,
`from_pretrained(..., distributed_config=DistributedConfig(fsdp_size=N))`, which applies torch's FSDP2
(`fully_shard`, per the model's `fsdp_plan`: each decoder layer, then the whole) across the job's N ranks.
Not the trainer's `fsdp`/`fsdp_config` arguments: those go through accelerate, which sets its FSDP mode only
for accelerator devices (accelerate/state.py), so on CPU ranks they train data-parallel and say nothing. A
model sharded at load time is sharded the same way on CPU ranks (gloo) as on GPUs (NCCL), and the Trainer
knows one when it sees it: it does not wrap it in DDP, every rank takes part when it is saved (its full
weights gathered, rank 0 writing), and a LoRA adapter attached after the sharding stays whole on each rank,
its gradient averaged over them. What differs on a GPU host is only the device and the collectives' backend.

Merging (`output.push: merged`): `save_merged`, on the host, as its docstring says.

Checkpoints: the Trainer saves a model sharded at load time alone (`save_only_model`, set in
handlers/toolkit/training.py: it keeps no optimizer state for one), its full weights gathered from the shards;
handlers/toolkit/distributed/checkpoints.py adds the optimizer's state (torch distributed checkpoint), the scheduler's
and the random generators', and resumes a later attempt from them at the step after the checkpoint.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch
from peft import PeftModel
from torch.distributed.tensor import DTensor
from transformers import DistributedConfig

from handlers.protocol import JobFailed
from handlers.toolkit.loading import load_causal_lm
from schemas.request import ModelSpec, RequestBase


def distributed_config(request: RequestBase) -> DistributedConfig | None:
    """How the policy is loaded for the request's `resources.shard`: None for a whole copy per process (a
    one-GPU job, or data-parallel), else FSDP2 over all of the job's processes. The daemon resolves 'auto' to
    'none' or 'fsdp' before the job starts (daemon/resources/shards.py); a child given 'auto' (run without the
    daemon's plan) loads a whole copy, as 'none'."""
    if request.resources.shard != "fsdp":
        return None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if (
        world != request.resources.gpus
    ):  # the daemon starts a job of N GPUs as N torchrun workers (handlers/child/launch.py)
        raise JobFailed(
            "config_invalid",
            "preflight",
            f"resources.shard: '{request.resources.shard}' shards over the job's {request.resources.gpus} "
            f"processes, and this child runs {world}",
        )
    return DistributedConfig(fsdp_size=world)


def is_sharded(model: object) -> bool:
    """Whether the model was sharded as it loaded (a PEFT model asks the model it wraps)."""
    return bool(getattr(model, "is_distributed_loading_by_transformers", False))  # set by transformers when it shards


def save_merged(model: PeftModel, spec: ModelSpec, artifact: Path, main: bool) -> None:
    """`output.push: merged` of a LoRA adapter trained on a sharded base: the adapter (whole on every rank) is written
    beside the artifact, and rank 0 loads the base whole on the host, in the dtype it trained in, merges the adapter
    into it with PEFT (`merge_and_unload`) and writes the merged model, as a whole-copy job's merge does. Merging in
    place would add each plain LoRA delta to a DTensor shard; the host's memory holds the whole base, a GPU's need not.
    Every rank calls it (the adapter's save is a collective of the sharded model's state);
    the others wait at a barrier."""
    adapter = artifact.parent / f"{artifact.name}.adapter"
    model.save_pretrained(str(adapter), is_main_process=main)
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    if distributed:  # every rank past its save (PEFT makes the folder on each) before rank 0 merges and removes it
        torch.distributed.barrier()
    if main:
        whole = load_causal_lm(str(model.get_base_model().name_or_path), spec)
        merged = PeftModel.from_pretrained(whole, str(adapter)).merge_and_unload()
        merged.save_pretrained(artifact)
        shutil.rmtree(adapter)
    if distributed:
        torch.distributed.barrier()


def held(model: torch.nn.Module) -> tuple[int, int, int]:
    """What this process holds of the model's parameters: (count, bytes, trainable count). Of a sharded
    parameter (a DTensor), this rank's shard; of any other, the whole tensor."""
    count = size = trainable = 0
    for parameter in model.parameters():
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        count += local.numel()
        size += local.numel() * local.element_size()
        trainable += local.numel() if parameter.requires_grad else 0
    return count, size, trainable


def rank_holdings(model: torch.nn.Module, of: str = "") -> dict[str, float]:
    """Each rank's parameters, for the `succeeded` event's metrics: `rank<r>_param_count`, `rank<r>_param_bytes`
    and `rank<r>_trainable_param_count` (`rank<r>_<of>param_count`... for another model than the policy, `of`
    "ref_" for a reference). A collective in a job of several processes: every rank calls it."""
    mine = held(model)
    ranks = [mine]
    if (
        torch.distributed.is_available()
        and torch.distributed.is_initialized()
        and torch.distributed.get_world_size() > 1
    ):
        ranks = [mine] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(ranks, mine)
    metrics: dict[str, float] = {}
    for rank, (count, size, trainable) in enumerate(ranks):
        metrics[f"rank{rank}_{of}param_count"] = float(count)
        metrics[f"rank{rank}_{of}param_bytes"] = float(size)
        metrics[f"rank{rank}_{of}trainable_param_count"] = float(trainable)
    return metrics
