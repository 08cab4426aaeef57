"""What a hostile answer costs TRL's accuracy reward, as TRL runs it and as adapterd does.

math-verify bounds parsing (10 s) and comparison (5 s) with signal.alarm: in a main thread only; in
any other thread TRL turns the bounds off. adapterd runs TRL's function in a worker process with a
hard kill (handlers/toolkit/rewards/math_verifier.py: ITEM_SECONDS an answer, CALL_SECONDS a call). For each
hostile LaTeX text (as the completion, or as the row's solution), seconds and reward: TRL's
accuracy_reward in a main thread, the same in a thread (capped at --cap seconds: past it, a job
would hang), and adapterd's. Each TRL run in a fresh process.

    uv run python -m benchmarks.math_verify_hostile [--cap 60] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from handlers.toolkit.rewards.math_verifier import ITEM_SECONDS, MathVerifier

# name → hostile text aimed at one weakness of LaTeX parsing or sympy.
CASES = {
    "nested_braces_5k": "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    "nested_frac_200": "\\boxed{" + "\\frac{1}{" * 200 + "2" + "}" * 200 + "}",
    "nested_sqrt_300": "\\boxed{" + "\\sqrt{" * 300 + "2" + "}" * 300 + "}",
    "sum_of_20k_terms": "\\boxed{" + "+".join(["x"] * 20000) + "}",
    "power_tower": "\\boxed{2^{2^{2^{2^{2^{100}}}}}}",
    "factorial_of_1e10": "\\boxed{(10^{10})!}",
    "boxed_2000_times": " ".join(f"\\boxed{{{i}}}" for i in range(2000)),
    "digits_100k": "\\boxed{" + "9" * 100000 + "}",
}

TRL_RUN = """
import json, sys, threading, time, logging
logging.disable(logging.CRITICAL)
from trl.rewards import accuracy_reward
accuracy_reward([[{"content": "\\\\boxed{1}"}]], ["$1$"])  # math-verify's parsers built before the clock starts
answer, solution, threaded = json.loads(sys.stdin.read())
found = []
run = lambda: found.append(accuracy_reward([[{"content": answer}]], [solution]))
start = time.perf_counter()
if threaded:
    thread = threading.Thread(target=run); thread.start(); thread.join()
else:
    run()
print(json.dumps([time.perf_counter() - start, found[0][0]]))
"""


def trl(answer: str, solution: str, threaded: bool, cap: float) -> str:
    try:
        done = subprocess.run(
            [sys.executable, "-c", TRL_RUN],
            input=json.dumps([answer, solution, threaded]),
            capture_output=True,
            text=True,
            timeout=cap + 30,
        )  # +30: the process's imports and warm-up
    except subprocess.TimeoutExpired:
        return f"over {cap:.0f} s (killed)"
    if done.returncode != 0:
        return f"died ({done.stderr.strip().splitlines()[-1][:60] if done.stderr.strip() else done.returncode})"
    seconds, reward = json.loads(done.stdout.strip().splitlines()[-1])
    return f"{seconds:6.2f} s -> {reward}" if seconds <= cap else f"over {cap:.0f} s ({seconds:.0f} s)"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--cap", type=float, default=60.0, help="seconds a TRL run in a thread may take before it counts as hung"
    )
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args()
    verifier = MathVerifier()
    verifier.score("accuracy", {}, [("\\boxed{1}", "$1$", 1)])  # the worker started, as in a job after its first call
    print(
        f"adapterd: {ITEM_SECONDS:.0f} s an answer, hard kill | TRL main thread: alarms 10 s + 5 s | TRL in a thread: "
        f"no bound (capped {args.cap:.0f} s)"
    )
    print(f"{'case':<20} {'where':<9} {'chars':>7} | {'adapterd':<22} | {'TRL, main thread':<22} | TRL, in a thread")
    for name, text in CASES.items():
        if args.only and name not in args.only:
            continue
        for where, answer, solution in (("answer", text, "$1$"), ("solution", "\\boxed{1}", text)):
            kills = verifier.kills
            start = time.perf_counter()
            [reward] = verifier.score("accuracy", {}, [(answer, solution, 1)])
            ours = f"{time.perf_counter() - start:6.2f} s -> {reward}" + (
                f" ({verifier.kills - kills} kill)" if verifier.kills > kills else ""
            )
            print(
                f"{name:<20} {where:<9} {len(text):>7} | {ours:<22} | {trl(answer, solution, False, args.cap):<22} | "
                f"{trl(answer, solution, True, args.cap)}",
                flush=True,
            )
    verifier.close()


if __name__ == "__main__":
    main()
