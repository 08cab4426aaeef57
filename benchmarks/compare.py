"""`python -m benchmarks.compare REV`: the benchmarks of revision REV and of this working tree, side
by side in one run on this machine, alternating (REV, here, REV, here, ...) so that both sides
share the machine's noise; prints each measure's values on both sides and the ratio of medians.

REV is checked out in a temporary git worktree with its own environment from its own uv.lock.
Use it to show that a change leaves the figures no worse:

    uv run python -m benchmarks.compare 64ff1fc --rounds 2 --only intake start
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run_benchmarks(tree: Path, results: Path, only: list[str], repeats: int) -> list[dict[str, object]]:
    # The old side may not know --results: read what it writes into its own tree.
    subprocess.run(
        ["uv", "run", "--frozen", "python", "-m", "benchmarks", "--only", *only, "--repeats", str(repeats)],
        cwd=tree,
        check=True,
    )
    shutil.copy(tree / "benchmarks" / "results" / "latest.json", results)
    return list(json.loads(results.read_text())["rows"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rev")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=["intake", "start"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="adapterd-compare-"))
    old_tree, new_tree = scratch / "old", scratch / "new"
    subprocess.run(["git", "worktree", "add", "--detach", str(old_tree), args.rev], cwd=HERE, check=True)
    # This side as it is now, uncommitted changes included, in a tree of its own, so that its
    # benchmarks/results stay untouched.
    shutil.copytree(HERE, new_tree, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "adapterd-demo"))
    values: dict[str, dict[str, list[float]]] = {}
    failures: list[str] = []
    try:
        for tree in (old_tree, new_tree):
            subprocess.run(["uv", "sync", "--frozen", "--quiet"], cwd=tree, check=True)
        for round_ in range(args.rounds):
            for side, tree in (("old", old_tree), ("new", new_tree)):
                try:
                    rows = run_benchmarks(tree, scratch / f"{side}-{round_}.json", args.only, args.repeats)
                except subprocess.CalledProcessError as exc:
                    # A side's run that fails is said and left out; the table shows how many each side has.
                    failures.append(f"{side} round {round_ + 1}: exit {exc.returncode}")
                    continue
                for row in rows:
                    if isinstance(row["value"], int | float):
                        key = f"{row['benchmark']}: {row['measure']}"
                        values.setdefault(key, {"old": [], "new": []})[side].append(float(row["value"]))
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(old_tree)], cwd=HERE, check=False)
    print(f"\n{args.rev} (old) against this tree (new), {args.rounds} alternating rounds\n")
    if failures:
        print(f"runs that failed, left out: {'; '.join(failures)}\n")
    print("| measure | old | new | new/old (medians) |\n|---|---|---|---|")
    for key, sides in values.items():
        if sides["old"] and sides["new"]:
            old, new = statistics.median(sides["old"]), statistics.median(sides["new"])
            ratio = f"{new / old:.3f}" if old else "n/a"
            print(f"| {key} | {sides['old']} | {sides['new']} | {ratio} |")


if __name__ == "__main__":
    main()
