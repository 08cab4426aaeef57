"""The checkpoints of a sharded job (`resources.shard: fsdp`, handlers/toolkit/distributed/fsdp.py) that resume: what
the Trainer keeps of a model sharded at load time, completed with the rest of the training state, and loaded back.

The Trainer checkpoints such a model alone (`save_only_model`: it refuses to save its optimizer), its full weights
gathered from the shards into the checkpoint folder, with `trainer_state.json`. `ShardedCheckpoints`, a callback
that runs on every rank at each save (before JobCallback, which may end the job at a stop), adds what a run needs
to go on:
- the optimizer's state through torch's distributed checkpoint (`torch.distributed.checkpoint.save`, the state from
  `get_optimizer_state_dict`, keyed by parameter name): each rank writes its own shard of it into
  `sharded/shard-<rank + 1>-model-00001-of-00001.safetensors` (`HuggingFaceStorageWriter`: safetensors with a JSON
  header, no pickle, so a checkpoint from the store is read as data only). A later attempt reads each rank's part of
  every tensor back from the files' headers, on as many ranks as before or another number;
- the learning-rate scheduler's state (`scheduler.pt`, rank 0) and each rank's random generators
  (`rng_state_<rank>.pth`), in the Trainer's own files, which it reads back with `torch.load(weights_only=True)`.

Resuming, the Trainer reads `trainer_state.json` (the step, the epoch, the batches to skip), each rank's random
generators, and the model's gathered weights, which it copies into the model with `load_state_dict`: a hook
(`take_full_weights`) gives each sharded parameter its own shard of the full tensor, as the model was sharded as it
loaded (a LoRA adapter is whole on every rank and loads as it is). The callback then loads the optimizer's and the
scheduler's state before the first step, so training goes on at the step after the checkpoint as if never stopped.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import HuggingFaceStorageReader, HuggingFaceStorageWriter
from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict
from torch.distributed.tensor import DTensor, distribute_tensor
from transformers import Trainer, TrainerCallback

from handlers.toolkit.callbacks import JobCallback

# the checkpoint's folder of DCP files (not named "optimizer*": the Trainer would look in it for optimizer.pt)
SHARDED_STATE = "sharded"
SCHEDULER = "scheduler.pt"  # the Trainer's name for it


def resumable(checkpoint: str | None) -> bool:
    """Whether `checkpoint` holds a sharded job's whole training state (an earlier version's held the model alone)."""
    return (
        checkpoint is not None
        and (Path(checkpoint) / SHARDED_STATE).is_dir()
        and (Path(checkpoint) / SCHEDULER).is_file()
    )


def attach(trainer: Trainer, checkpoint: str | None) -> str | None:
    """Make the trainer of a sharded model save checkpoints that resume, and resume from `checkpoint` (the earlier
    attempt's last; None: none). Where training starts: `checkpoint`, or None (step 0) for a checkpoint that
    holds the model alone, which a run cannot go on from (said in the job's log)."""
    start = checkpoint if resumable(checkpoint) else None
    if checkpoint is not None and start is None:
        print(
            f"adapterd child {os.getpid()}: sharded: {checkpoint} has no optimizer state to "
            "resume; training starts at step 0",
            flush=True,
        )
    trainer.model.register_load_state_dict_pre_hook(take_full_weights)  # type: ignore[union-attr]
    # Before JobCallback: its save handler reports the checkpoint to the daemon, and ends the job at a stop.
    job = trainer.pop_callback(JobCallback)
    trainer.add_callback(ShardedCheckpoints(start))
    if job is not None:
        trainer.add_callback(job)
    return start


def take_full_weights(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
    """A `load_state_dict` pre-hook of a sharded model: each full tensor given for a sharded parameter becomes this
    rank's shard of it, sharded as the parameter is (every rank read the same full tensor: no collective)."""
    parameters = dict(module.named_parameters(prefix=prefix.rstrip("."), remove_duplicate=False))  # tied ones too
    for name, value in state_dict.items():
        parameter = parameters.get(name)
        if isinstance(parameter, DTensor) and not isinstance(value, DTensor):
            state_dict[name] = distribute_tensor(
                value.to(parameter.dtype), parameter.device_mesh, parameter.placements, src_data_rank=None
            )


def _optimizer(kwargs: dict[str, Any]) -> torch.optim.Optimizer:
    optimizer = kwargs["optimizer"]
    return getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps torch's


def _tensors(state: dict[str, Any]) -> dict[str, dict[str, torch.Tensor]]:
    """The tensors of an optimizer's state (`get_optimizer_state_dict`), by parameter name: independent of how the
    optimizer grouped the parameters, which may differ on another number of ranks. The groups' settings (learning
    rate, betas, ...) come from the request, each run's optimizer built with them, and the scheduler sets the rate."""
    return {
        name: {key: value for key, value in entry.items() if isinstance(value, torch.Tensor)}
        for name, entry in state["state"].items()
    }


def rng_states() -> dict[str, Any]:
    """This process's random generators, as the Trainer saves and restores them (`rng_state_<rank>.pth`)."""
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


class ShardedCheckpoints(TrainerCallback):
    """Saves, with each of the Trainer's checkpoints, the training state it leaves out for a sharded model; loads it
    back from `resume_from` before the first step (this module's docstring)."""

    def __init__(self, resume_from: str | None) -> None:
        self.resume_from = resume_from

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.resume_from is None:
            return
        model, optimizer, scheduler = kwargs["model"], _optimizer(kwargs), kwargs["lr_scheduler"]
        current: dict[str, Any] = dict(
            get_optimizer_state_dict(model, optimizer)
        )  # the optimizer's state made (zeros), each rank's shard to be filled
        saved = _tensors(current)
        dcp.load(
            {"optimizer": saved}, storage_reader=HuggingFaceStorageReader(str(Path(self.resume_from) / SHARDED_STATE))
        )
        loaded: Any = {
            "state": {name: {**entry, **saved[name]} for name, entry in current["state"].items()},
            "param_groups": current["param_groups"],
        }
        set_optimizer_state_dict(model, optimizer, loaded)
        scheduler.load_state_dict(torch.load(Path(self.resume_from) / SCHEDULER, weights_only=True))
        for group, rate in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = rate  # what the scheduler last set: the Trainer restores it with the optimizer's own state
        print(
            f"adapterd child {os.getpid()}: sharded: resumed the optimizer and scheduler of "
            f"{self.resume_from} at step {state.global_step}",
            flush=True,
        )

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        torch.save(rng_states(), folder / f"rng_state_{args.process_index}.pth")
        if state.is_world_process_zero:
            torch.save(kwargs["lr_scheduler"].state_dict(), folder / SCHEDULER)
        # A collective: every rank writes its shard, and none goes on before all have (the checkpoint is whole then).
        optimizer = _tensors(get_optimizer_state_dict(kwargs["model"], _optimizer(kwargs)))
        dcp.save(
            {"optimizer": optimizer},
            storage_writer=HuggingFaceStorageWriter(str(folder / SHARDED_STATE), save_distributed=True),
        )
