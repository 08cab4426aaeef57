"""What the daemon sees of a child: the status pipe (`StatusReporter`): stages and their parts, heartbeats
through the stages without steps, and a stop asked for (SIGTERM). The trainer callback that reports
through it is handlers/toolkit/callbacks.py's `JobCallback`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, TextIO

import torch

from handlers.protocol import (
    ChildError,
    ChildMessage,
    Heartbeat,
    JobFailed,
    Ready,
    Refused,
    StageEntered,
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
    """Writes one JSON object per line to the daemon (its stream of the child's messages), and counts the seconds
    of each stage and of the parts of a split one (`durations_s`). The sink: a file descriptor, the pipe a child on
    the daemon's host was given (ADAPTERD_STATUS_FD), or any text stream, line-buffered (a child run elsewhere
    reports through its engine's channel)."""

    active: StatusReporter | None = None  # the process's reporter (a child runs one job), for `part`

    def __init__(self, sink: int | TextIO) -> None:
        self._stream = os.fdopen(sink, "w", buffering=1) if isinstance(sink, int) else sink
        self.stage = "preflight"
        self._stage_started = time.monotonic()
        self._part: str | None = None
        self._part_started = self._stage_started
        self.durations_s: dict[str, float] = {}
        StatusReporter.active = self
        # Set on SIGTERM while training: the trainer saves a checkpoint at its next step and stops.
        self.stop_requested = False
        # The model the request's evaluation is measuring (handlers/toolkit/evaluation/__init__.py), for its progress
        # reports.
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
