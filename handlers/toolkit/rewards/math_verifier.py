"""TRL's math rewards (accuracy, reasoning_accuracy, cosine_scaled) run in a worker process with a
hard kill, so that what a hostile answer or solution can cost is bounded.

math-verify bounds its own parsing (10 s) and comparison (5 s) with signal.alarm, which works only in
a main thread and cannot stop a long step in C (sympy's big integers). The worker
(handlers/child/math_worker.py) runs TRL's functions in its main thread, one completion at a time;
an answer that takes longer than ITEM_SECONDS kills the worker (a spare, already started, takes its
place), and the completion is scored again as an empty one (what TRL gives an answer it cannot
parse: 0.0, the cosine schedule's wrong value); when that too runs out (the row's solution is the
hostile text) the reward is None, TRL's "not given", as for a solution math-verify cannot parse.
One reward call checks for CALL_SECONDS at most (one answer's ITEM_SECONDS past it at worst): the
completions left after that get None. benchmarks/math_verify_hostile.py measures what this bounds.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from typing import Any

from handlers.toolkit.fast import log

# What one answer may take (a correct answer takes milliseconds; math-verify's own bounds are 10 + 5 s).
ITEM_SECONDS = 3.0
# What one reward call may take in all: a batch of hostile answers costs at most this.
CALL_SECONDS = 60.0
# Starting the worker (importing sympy and math-verify), not counted in an answer's time.
START_SECONDS = 60.0


class _Failed(Exception):
    """The worker did not answer in time, or died."""


class MathVerifier:
    """One worker for the job, started when first asked and replaced by a spare after a kill; thread-safe."""

    def __init__(self, item_seconds: float = ITEM_SECONDS, call_seconds: float = CALL_SECONDS) -> None:
        self.item_seconds, self.call_seconds = item_seconds, call_seconds
        self.kills = 0  # workers killed for an answer that took too long (or that crashed one)
        self._process: subprocess.Popen[bytes] | None = None
        self._spare: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def score(self, reward: str, params: dict[str, Any], items: list[tuple[str, str, int]]) -> list[float | None]:
        """TRL's `reward` with `params` for each (completion, solution, completion length in tokens)."""
        results: list[float | None] = []
        with self._lock:
            deadline = time.monotonic() + self.call_seconds
            for completion, solution, length in items:
                if time.monotonic() >= deadline:
                    results.append(None)
                    continue
                task = {
                    "reward": reward,
                    "params": params,
                    "completion": completion,
                    "solution": solution,
                    "length": length,
                }
                try:
                    results.append(self._ask(task))
                except _Failed:
                    log(
                        "math_verify_killed",
                        reward=reward,
                        seconds=self.item_seconds,
                        chars=len(completion),
                        solution_chars=len(solution),
                    )
                    try:
                        if time.monotonic() >= deadline:
                            raise _Failed
                        results.append(self._ask({**task, "completion": ""}))  # scored as an answer TRL cannot parse
                    except _Failed:
                        results.append(None)  # the solution itself cannot be checked in time: the row is skipped
        return results

    def close(self) -> None:
        with self._lock:
            self._kill()
            if self._spare is not None:
                _end(self._spare)
                self._spare = None

    def _ask(self, task: dict[str, Any]) -> float | None:
        process = self._ready()
        assert process.stdin is not None
        try:
            process.stdin.write((json.dumps(task) + "\n").encode())
            process.stdin.flush()
            answer = _line(process, self.item_seconds)
        except (OSError, _Failed):
            self.kills += 1
            self._kill()
            raise _Failed from None
        value = answer.get("reward")
        return None if value is None else float(value)

    def _ready(self) -> subprocess.Popen[bytes]:
        """The worker, ready; and a spare starting beside it, so that a kill costs no start-up (the
        spare's imports and first check, seconds on a busy host) before the next answer."""
        if self._process is None:
            process, self._spare = self._spare or _spawn(), None
            try:
                _line(process, START_SECONDS)  # {"ready": true}: at once, when the spare had time to start
            except _Failed:
                _end(process)
                raise
            self._process = process
        if self._spare is None:
            self._spare = _spawn()
        return self._process

    def _kill(self) -> None:
        if self._process is not None:
            _end(self._process)
            self._process = None


def _spawn() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "handlers.child.math_worker", str(os.getpid())],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def _line(process: subprocess.Popen[bytes], seconds: float) -> dict[str, Any]:
    """The worker's next line within `seconds`, or _Failed (it is too slow, or died)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    line = process.stdout.readline() if ready else b""  # a whole line: the worker writes each in one write
    if not line:
        raise _Failed
    return dict(json.loads(line))


def _end(process: subprocess.Popen[bytes]) -> None:
    process.kill()
    process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None:
            stream.close()


_verifier: MathVerifier | None = None


def verifier() -> MathVerifier:
    """The job's verifier, closed (its worker killed) when the job's process exits."""
    global _verifier
    if _verifier is None:
        _verifier = MathVerifier()
        atexit.register(_verifier.close)
    return _verifier
