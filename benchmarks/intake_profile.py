"""Where intake's time goes: the daemon rejecting bad requests under py-spy, as inclusive shares.

    uv run python -m benchmarks.intake_profile --messages 60000

Fills a topic with intake's bad-message mix (benchmarks.intake), starts a daemon on it
(log_level=error), samples it with py-spy while it rejects them all, and prints the functions
holding the most samples, inclusive (a function and everything it calls), as a share of the samples
in which the daemon was busy (py-spy leaves out idle samples, such as waiting in the event loop's
select). Also printed: the rejection rate of this run, from the broker's timestamps of the first
and last `rejected` event, which sampling slows a little.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

from benchmarks.harness import Environment
from benchmarks.intake import fill
from testbed.client import committed_offset, read_records

FRAME = re.compile(r"^(?P<function>[^ ]+) \((?P<file>[^:]+):\d+\)$")


def module_of(file: str) -> str:
    """A frame's file as a module name: what follows site-packages, else its folder and name."""
    parts = Path(file).with_suffix("").parts
    parts = parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else parts[-2:]
    return ".".join(parts)


def inclusive_shares(raw: str) -> tuple[Counter[str], int]:
    """py-spy's raw output (`frame;frame;... count` per stack) → samples per function (each counted
    once per stack it appears in) and the total number of samples."""
    shares: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        total += int(count)
        names = set()
        for frame in stack.split(";"):
            match = FRAME.match(frame.strip())
            if match:
                names.add(f"{module_of(match['file'])}:{match['function']}")
        for name in names:
            shares[name] += int(count)
    return shares, total


async def profile(messages: int, top: int, output: Path) -> None:
    env = Environment.start()
    try:
        settings = await env.settings(warm_child=False, log_level="error")
        await fill(settings, messages)
        daemon = env.daemon(settings)
        assert daemon.process is not None
        spy = subprocess.Popen(
            [
                str(Path(sys.executable).with_name("py-spy")),
                "record",
                "--pid",
                str(daemon.process.pid),
                "--format",
                "raw",
                "--rate",
                "250",
                "--output",
                str(output),
                "--nonblocking",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            events = await read_records(settings, settings.events_topic, messages, timeout_s=900)
            assert await committed_offset(settings) == messages
        finally:
            spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
            spy.wait(timeout=60)
            daemon.stop()
    finally:
        env.stop()
    rate = (messages - 1) / ((events[-1].timestamp - events[0].timestamp) / 1000)
    shares, total = inclusive_shares(output.read_text())
    print(
        f"{messages} rejected at {rate:,.0f}/s under sampling; {total} busy samples (py-spy, 250 Hz, --nonblocking)\n"
    )
    print("| function (module:function) | inclusive share of busy samples |")
    print("|---|---|")
    for name, count in shares.most_common(top):
        print(f"| {name} | {count / total:.1%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=60_000)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--output", type=Path, default=Path("/tmp/adapterd-intake-profile.txt"), help="py-spy's raw stacks"
    )
    args = parser.parse_args()
    if sys.platform != "linux":
        raise SystemExit("py-spy attaches to a running process on Linux here")
    asyncio.run(profile(args.messages, args.top, args.output))


if __name__ == "__main__":
    main()
