"""Checkpoints for PPO that a later attempt can resume from, which trl 1.12's PPOTrainer does not
give: its `train()` takes no checkpoint and starts at step 0, and its checkpoints hold only the
policy (its `save_model` drops the value model).

`PPOCheckpoints` is a trainer callback that adds the value head to each checkpoint, and `resume()`
loads a checkpoint's policy weights, value head, optimizer, scheduler and counters before training,
so the run goes on at the step after the checkpoint with the state it had there. One difference
from `Trainer`'s resume stays: PPOTrainer's prompt iterator is local to its loop, so the resumed
run draws prompts from the start of the (seeded) shuffle again rather than where the first stopped.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, TrainerCallback

VALUE_MODEL_FILE = "value_model.pt"


class PPOCheckpoints(TrainerCallback):
    def __init__(self, value_model: PreTrainedModel) -> None:
        self.value_model = value_model
        self.resumed_from: int | None = None  # the checkpoint's step, when this run resumed
        self._episode = 0
        self._log_history: list[dict[str, Any]] = []

    def resume(self, trainer: Any, checkpoint: str | None) -> None:
        """Load `checkpoint` (None: start at step 0) into a built PPOTrainer, before `train()`."""
        if checkpoint is None:
            return
        folder, device = Path(checkpoint), trainer.accelerator.device
        trainer._load_from_checkpoint(
            checkpoint, model=trainer.model.policy
        )  # the adapter (or full weights), as Trainer does
        self.value_model.load_state_dict(torch.load(folder / VALUE_MODEL_FILE, weights_only=True, map_location=device))
        # Trainer._load_optimizer_and_scheduler needs Trainer attributes PPOTrainer never
        # sets: load the two files directly.
        trainer.optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, map_location=device))
        trainer.lr_scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
        saved = json.loads((folder / "trainer_state.json").read_text())
        self.resumed_from, self._episode, self._log_history = (
            saved["global_step"],
            saved["episode"],
            saved["log_history"],
        )

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # PPOTrainer.train() has just set the counters to 0 and will loop `num_total_batches` times:
        # go on from the checkpoint instead (this runs before JobCallback, which reads the start step).
        if self.resumed_from is None:
            return
        state.global_step, state.episode, state.log_history = self.resumed_from, self._episode, self._log_history
        args.num_total_batches = state.max_steps - self.resumed_from

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            torch.save(self.value_model.state_dict(), path / VALUE_MODEL_FILE)
        # PPOTrainer never starts a step with `on_step_begin`, which is what resets `should_save` in
        # Trainer: without this, every step after the first periodic checkpoint would save another.
        control.should_save = False
