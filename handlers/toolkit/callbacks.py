"""The trainer callbacks of a job's child: `StepClock`, each optimizer step's duration (for the median step
time a `succeeded` event reports, and the benchmarks' plain TRL), and `JobCallback`, what the daemon sees
of a trainer through the status pipe (handlers/toolkit/reporting.py): the first step, progress with an
ETA (in a job of several processes, each rank's tokens/s and peak memory), heartbeats, checkpoints, and
a stop at a checkpoint when the daemon asks for one.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import TrainerCallback

from handlers.protocol import CheckpointSaved, FirstStep, Heartbeat, JobSpec, ProgressReport, StoppedAtCheckpoint
from handlers.toolkit.distributed.ranks import TokenCount, gather, peak_bytes, world_size
from handlers.toolkit.reporting import EXIT_STOPPED, HEARTBEAT_S, StatusReporter
from schemas.common import RankProgress


class StepClock(TrainerCallback):
    """The time between consecutive optimizer steps of this run. The first step (lazy set-up, the
    allocator's first pages) is not among them, so their median is the trainer's steady pace:
    what benchmarks.overhead compares between the daemon's child and plain TRL."""

    def __init__(self) -> None:
        self.last_step_at: float | None = None
        self.step_seconds: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        now = time.perf_counter()
        if self.last_step_at is not None:
            self.step_seconds.append(now - self.last_step_at)
        self.last_step_at = now

    def median_step_s(self) -> float | None:
        return statistics.median(self.step_seconds) if self.step_seconds else None


class JobCallback(StepClock):
    """What the daemon sees of a trainer: the first optimizer step; progress at the job's interval
    (at least `progress_interval_steps` steps and `progress_interval_s` seconds apart, and always the
    last step); each checkpoint saved; and, once a stop is requested, a checkpoint and a clean exit."""

    def __init__(self, reporter: StatusReporter, job: JobSpec) -> None:
        super().__init__()
        self.reporter = reporter
        self.job = job
        self.first_step: int | None = None  # global step this run started from (non-zero after a resume)
        self.first_step_done: float | None = None  # when this run's first optimizer step ended
        self.last_sent_at = float("-inf")
        self.last_sent_step = 0
        self.last_tokens: tuple[float, float] | None = None  # (time, tokens seen) at the previous log
        self.last_beat = float("-inf")
        self.eval_batch = 0  # batches of the current evaluation pass
        self.tokens = TokenCount()  # this rank's own tokens, in a job of several processes
        self.rank_tokens: list[tuple[float, float]] | None = None  # each rank's tokens, and when, at the previous log
        self.train_s: tuple[float, float] | None = None  # when this run's training began and ended

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.first_step = state.global_step
        self.last_sent_step = state.global_step
        self.train_s = (time.monotonic(), time.monotonic())
        if world_size() > 1 and kwargs.get("model") is not None:
            self.tokens.attach(kwargs["model"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.train_s is not None:
            self.train_s = (self.train_s[0], time.monotonic())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        super().on_step_end(args, state, control, **kwargs)
        if state.global_step == (self.first_step or 0) + 1:
            self.first_step_done = time.monotonic()
            self.reporter.send(FirstStep(time=time.time(), step=state.global_step))
            self.reporter.part("steps")
        if time.monotonic() - self.last_beat >= HEARTBEAT_S:
            self.last_beat = time.monotonic()
            self.reporter.send(Heartbeat(step=state.global_step))  # alive: the daemon's stall watchdog listens
        if self._stop_everywhere(args):
            control.should_save = True
            control.should_training_stop = True

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # An evaluation (during training, or the request's after it) takes no optimizer step: its
        # batches say the child is alive, for the watchdog that watches training and evaluation.
        now = time.monotonic()
        if now - self.last_beat >= HEARTBEAT_S:
            self.last_beat = now
            self.reporter.send(Heartbeat(step=state.global_step))
        if self.reporter.evaluating is None:
            return  # an evaluation during training: its numbers are in the trainer's log
        self.eval_batch += 1
        batches = kwargs.get("eval_dataloader")
        # a dataloader over a stream has no length
        total = len(batches) if batches is not None and hasattr(batches, "__len__") else None
        if now - self.last_sent_at >= self.job.progress_interval_s or self.eval_batch == total:
            self.last_sent_at = now
            self.reporter.send(
                ProgressReport(
                    step=state.global_step,
                    total_steps=max(state.max_steps, 1),
                    epoch=state.epoch,
                    stage="evaluate",
                    evaluating=self.reporter.evaluating,
                    eval_batch=self.eval_batch,
                    eval_batches=total,
                )
            )

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.eval_batch = 0  # the next model's pass counts its own batches

    def _stop_everywhere(self, args: Any) -> bool:
        """Whether any rank was asked to stop. Data-parallel ranks must stop at the same step, or
        the ones still training wait forever on the others' gradients: so they agree at each step."""
        if args.world_size <= 1:
            return self.reporter.stop_requested
        flag = torch.tensor([1.0 if self.reporter.stop_requested else 0.0], device=args.device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        stop = bool(flag.item())
        self.reporter.stop_requested = stop
        return stop

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        path = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.reporter.send(CheckpointSaved(step=state.global_step, path=str(path)))
        if self.reporter.stop_requested:
            self.reporter.send(StoppedAtCheckpoint(step=state.global_step, path=str(path)))
            raise SystemExit(EXIT_STOPPED)

    def _eta(self, step: int, total: int, now: float) -> float | None:
        """The seconds left at the pace of this run's steps since its first: the first carries one-time set-up (the
        data loader's start, a checkpoint's load, kernels' first runs) that would make an early ETA several times too
        long, and the fleet's queue builds every waiting request's ETA on the running jobs' own. None until a
        step after the first has ended; 0 at the last step."""
        if step >= total:
            return 0.0
        since_first = step - (self.first_step or 0) - 1
        if since_first < 1 or self.first_step_done is None:
            return None
        return (now - self.first_step_done) / since_first * (total - step)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "train_runtime" in logs or any(key.startswith("eval_") for key in logs):
            return  # the end-of-training summary or an evaluation, not a training step
        now = time.monotonic()
        ranks = self._ranks(
            args, now
        )  # a collective: every rank, at every training log, whether or not a report is due
        tokens_per_s = None
        if "num_tokens" in logs:  # TRL's trainers log the tokens seen so far
            if self.last_tokens is not None and now > self.last_tokens[0]:
                tokens_per_s = (logs["num_tokens"] - self.last_tokens[1]) / (now - self.last_tokens[0])
            self.last_tokens = (now, float(logs["num_tokens"]))
        last = state.global_step >= state.max_steps
        due = (
            state.global_step - self.last_sent_step >= self.job.progress_interval_steps
            and now - self.last_sent_at >= self.job.progress_interval_s
        )
        if not (due or last):
            return
        self.last_sent_at, self.last_sent_step = now, state.global_step
        total = max(state.max_steps, 1)
        eta = self._eta(state.global_step, total, now)
        self.reporter.send(
            ProgressReport(
                step=state.global_step,
                total_steps=total,
                epoch=state.epoch,
                loss=logs.get("loss"),
                learning_rate=logs.get("learning_rate"),
                grad_norm=logs.get("grad_norm"),
                reward=logs.get("reward"),  # the online methods' mean reward over the logged steps
                tokens_per_s=tokens_per_s,
                eta_s=eta,
                ranks=ranks,
                peak_bytes=max(rank.peak_bytes for rank in ranks) if ranks else None,
            )
        )

    def _ranks(self, args: Any, now: float) -> list[RankProgress] | None:
        """Each rank's tokens/s since the previous log and its peak memory so far, gathered from every rank; None in a
        job of one process, whose tokens/s is the report's own."""
        if world_size() == 1:
            return None
        figures = gather([float(self.tokens.tokens), float(peak_bytes(self.reporter.memory.use()))], args.device)
        before = self.rank_tokens
        self.rank_tokens = [(now, tokens) for tokens, _ in figures]
        return [
            RankProgress(
                rank=rank,
                peak_bytes=int(peak),
                tokens_per_s=(tokens - before[rank][1]) / (now - before[rank][0])
                if before and now > before[rank][0]
                else None,
            )
            for rank, (tokens, peak) in enumerate(figures)
        ]

    def rank_metrics(self, args: Any) -> dict[str, float]:
        """For `succeeded`: each rank's tokens over this run's training seconds, `rank<r>_tokens_per_s` (a collective;
        nothing in a job of one process, whose tokens/s the trainer's summary says)."""
        if world_size() == 1 or self.train_s is None:
            return {}
        seconds = max(self.train_s[1] - self.train_s[0], 1e-9)
        return {
            f"rank{rank}_tokens_per_s": tokens / seconds
            for rank, (tokens,) in enumerate(gather([float(self.tokens.tokens)], args.device))
        }
