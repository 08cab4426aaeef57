"""What the daemon sees of a child: the status pipe (`StatusReporter`) and the trainer callback that
reports through it (`JobCallback`): the first step, progress, heartbeats, checkpoints, and a stop at
a checkpoint when the daemon asks for one (SIGTERM). Also each step's duration (`StepClock`), for
the median step time a `succeeded` event reports.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import TrainerCallback

from handlers.protocol import (
    CheckpointSaved,
    ChildError,
    ChildMessage,
    FirstStep,
    Heartbeat,
    JobFailed,
    JobSpec,
    ProgressReport,
    Ready,
    Refused,
    StageEntered,
    StoppedAtCheckpoint,
)
from handlers.toolkit.memory import MemoryWatch

# While training, the child tells the daemon it is alive at least this often (at step ends).
HEARTBEAT_S = 5.0
# Stages without steps that the daemon's stall watchdog watches: a thread beats through them.
PULSED_STAGES = frozenset({"load_model"})
# The child's exit status after stopping at a checkpoint because the daemon asked it to.
EXIT_STOPPED = 75
# The stages whose seconds are split into parts, and the part each starts in: `load_model` into
# files (finding or downloading the model, its tokenizer), cuda_init (CUDA's own start), weights
# (from_pretrained) and trainer (the trainer's construction: tokenization, PEFT, moving to the
# device); `train` into first_step (set-up to the end of the first optimizer step) and steps.
FIRST_PART = {"load_model": "files", "train": "first_step"}


def part(name: str) -> None:
    """Where the current stage's seconds go from now on (`durations_s["<stage>.<name>"]`), when the
    stage is one that is split (`FIRST_PART`); said by the code that starts the part."""
    if StatusReporter.active is not None:
        StatusReporter.active.part(name)


@contextmanager
def loading_weights() -> Iterator[None]:
    """Around a `from_pretrained`: its seconds are `load_model.weights`; what follows until training,
    the trainer's construction, is `load_model.trainer`."""
    part("weights")
    try:
        yield
    finally:
        part("trainer")


def applied(setting: str, value: str | bool) -> None:
    """One of the host's speed settings (`JobSpec.fast`) this job runs with (`TrainResult.fast`); said
    by the code that applies it (handlers/toolkit/fast.py)."""
    if StatusReporter.active is not None:
        StatusReporter.active.fast[setting] = value


def start_cuda(memory: MemoryWatch | None = None, memory_fraction: float | None = None) -> None:
    """`load_model.cuda_init`: CUDA's own start (the driver, a context on this process's GPU), measured
    here so that it is not counted in the weights' or the trainer's seconds. Before its first
    allocation, the job's share of the GPU (`memory_fraction`) is set and `memory` starts counting
    (handlers/toolkit/memory.py). Nothing on a host without CUDA."""
    if not torch.cuda.is_available():
        return
    part("cuda_init")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))  # a worker of a multi-GPU job: its own GPU
    if memory is not None:
        memory.start(device, memory_fraction)
    # An allocation and a kernel, waited for: the context exists after this (an empty tensor makes none:
    # seen on an H200, where this part was then 0.0 s and the context's start fell into the trainer's).
    torch.zeros(1, device=device).add_(1)
    torch.cuda.synchronize(device)
    part("files")


class StatusReporter:
    """Writes one JSON object per line to the pipe the parent reads (fd in ADAPTERD_STATUS_FD), and
    counts the seconds of each stage and of the parts of a split one (`durations_s`)."""

    active: StatusReporter | None = None  # the process's reporter (a child runs one job), for `part`

    def __init__(self, fd: int) -> None:
        self._stream = os.fdopen(fd, "w", buffering=1)
        self.stage = "preflight"
        self._stage_started = time.monotonic()
        self._part: str | None = None
        self._part_started = self._stage_started
        self.durations_s: dict[str, float] = {}
        StatusReporter.active = self
        # Set on SIGTERM while training: the trainer saves a checkpoint at its next step and stops.
        self.stop_requested = False
        # The model the request's evaluation is measuring (handlers/toolkit/evaluation.py), for its progress reports.
        self.evaluating: Literal["adapter", "base", "current"] | None = None
        self._lock = threading.Lock()  # the pulse thread writes too
        self._pulse: threading.Thread | None = None
        self.memory = MemoryWatch()  # sampled at each message sent, once the job's CUDA has started
        self.fast: dict[str, str | bool] = {}  # the host's speed settings applied (`applied`)

    def restart_clock(self) -> None:
        """Stage durations count from the job's arrival, not from the child's start."""
        self._stage_started = self._part_started = time.monotonic()

    def send(self, message: ChildMessage) -> None:
        with self._lock:
            self.memory.sample()  # where the child beats: heartbeats, progress, stages (MemoryWatch)
            self._stream.write(message.model_dump_json() + "\n")

    def ready(self) -> None:
        self.send(Ready())

    def refused(self, reason: str) -> None:
        self.send(Refused(reason=reason))

    def close(self) -> None:
        self._stream.close()

    def enter(self, stage: str) -> None:
        now = time.monotonic()
        self._add(self.stage, now - self._stage_started)
        self.part(None, now)  # the last part of a split stage ends with it
        self.stage, self._stage_started = stage, now
        self._part, self._part_started = FIRST_PART.get(stage), now
        self.send(StageEntered(stage=stage))
        if stage in PULSED_STAGES and self._pulse is None:
            self._pulse = threading.Thread(target=self._beat, name="adapterd-pulse", daemon=True)
            self._pulse.start()

    def _beat(self) -> None:
        """Beat every HEARTBEAT_S while a stage without steps runs (loading the model). A thread needs
        the interpreter's lock to beat: downloads and weight loading release it, so they keep the
        job alive however long they take, while a library call that holds it for minutes (a regular
        expression backtracking) falls silent, and the daemon's stall watchdog stops the job."""
        while self.stage in PULSED_STAGES:
            time.sleep(HEARTBEAT_S)
            try:
                if self.stage in PULSED_STAGES:
                    self.send(Heartbeat(step=0))
            except ValueError:  # the pipe was closed: the job is over
                break
        self._pulse = None

    def part(self, name: str | None, now: float | None = None) -> None:
        """End the current part of a split stage and start `name` (nothing in a stage that is not split)."""
        if self._part is None:
            return
        now = time.monotonic() if now is None else now
        self._add(f"{self.stage}.{self._part}", now - self._part_started)
        self._part, self._part_started = name, now

    def _add(self, key: str, seconds: float) -> None:
        self.durations_s[key] = round(self.durations_s.get(key, 0.0) + seconds, 3)

    def error(self, failure: JobFailed) -> None:
        self.send(ChildError.of(failure))


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

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.first_step = state.global_step
        self.last_sent_step = state.global_step

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
        total = len(batches) if batches is not None and hasattr(batches, "__len__") else None
        if now - self.last_sent_at >= self.job.progress_interval_s or self.eval_batch == total:
            self.last_sent_at = now
            self.reporter.send(ProgressReport(
                step=state.global_step, total_steps=max(state.max_steps, 1), epoch=state.epoch, stage="evaluate",
                evaluating=self.reporter.evaluating, eval_batch=self.eval_batch, eval_batches=total,
            ))

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
        self.reporter.send(ProgressReport(
            step=state.global_step, total_steps=total, epoch=state.epoch,
            loss=logs.get("loss"), learning_rate=logs.get("learning_rate"), grad_norm=logs.get("grad_norm"),
            tokens_per_s=tokens_per_s, eta_s=eta,
        ))

