"""The math-verify worker: `python -m handlers.child.math_worker PARENT_PID`, started by
handlers/toolkit/rewards/math_verifier.py. It scores one completion at a time with TRL's own math rewards
(accuracy_reward, reasoning_accuracy_reward, get_cosine_scaled_reward) in its main thread, where
math-verify's signal.alarm timeouts work, and answers on a pipe of its own.

Protocol: after its imports it writes `{"ready": true}`; then for each JSON line on stdin
(`{"reward", "params", "completion", "solution", "length"}`) one line `{"reward": float | null}`.
The parent kills it when an answer takes too long (what signal.alarm cannot stop: a long step in C,
sympy's big integers) and starts another; its address space is bounded, so a hostile answer that
grows memory fails here, not in the trainer.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import signal
import sys
from typing import Any

PR_SET_PDEATHSIG = 1
# The worker's address space: sympy and math-verify need ~0.3 GiB; a hostile answer stops at this.
ADDRESS_SPACE = 4 << 30


def die_with_parent(parent: int) -> None:
    """SIGKILL this worker when the job's child dies, so no worker outlives its job."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)  # the parent died before prctl took effect


def score(task: dict[str, Any]) -> float | None:
    """TRL's reward for one completion and its row's solution."""
    from trl.rewards import accuracy_reward, get_cosine_scaled_reward, reasoning_accuracy_reward

    completions = [[{"role": "assistant", "content": task["completion"]}]]
    solution = [task["solution"]]
    name, params = task["reward"], task["params"]
    if name == "accuracy":
        rewards = accuracy_reward(completions, solution)
    elif name == "reasoning_accuracy":
        rewards = reasoning_accuracy_reward(
            completions, solution, reasoning_delimiters=params.get("reasoning_delimiters")
        )
    elif name == "cosine_scaled":  # the schedule reads only the number of completion tokens
        rewards = get_cosine_scaled_reward(**params)(completions, solution, completion_ids=[[0] * task["length"]])
    else:
        raise ValueError(f"not a math reward: {name!r}")
    return rewards[0]


def main(parent: int) -> None:
    die_with_parent(parent)
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    # The answers go on a descriptor of their own: whatever a library prints lands on stderr.
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    # math-verify logs the whole unparseable text at each timeout: a hostile answer would flood the job's log.
    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.CRITICAL)
    # One answer checked before `ready`: the first check builds math-verify's parsers (a second or
    # more), which is start-up, not an answer's time.
    score({"reward": "accuracy", "params": {}, "completion": "\\boxed{1}", "solution": "$1$", "length": 1})
    answers.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        answers.write(json.dumps({"reward": score(json.loads(line))}) + "\n")


if __name__ == "__main__":
    main(int(sys.argv[1]))
