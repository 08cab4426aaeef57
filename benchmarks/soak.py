"""Soak: many small requests while daemons are killed (SIGKILL) and restarted at random.

    uv run python -m benchmarks.soak --requests 300 --daemons 2 --kill-every 45

Prints what the promise is about: requests sent, terminal outcomes, requests lost (committed without
a terminal event, judged per partition from the group's committed offsets), requests still
unfinished when the run ended (uncommitted), duplicate Hub commits (more than one commit for a
request id), duplicate trainings (a request trained to its last step twice) and requests with a
checkpointed step trained again (a retry resumes from the last checkpoint on the same host; on
another host it starts over), and how many requests were started more than once. The daemons use
static membership by default, as deploy/README.md advises (`--no-static-membership` to leave it out). Not a unit test: it runs for as long as it takes.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import signal
import time
from collections import Counter

from benchmarks.harness import HUB_TOKEN, Environment, publish_all
from daemon.kafka.event_reader import EventStream
from daemon.local_broker import free_port
from schemas import TERMINAL_TYPES
from testbed.client import committed_offset
from testbed.data import CHAT_ROWS
from testbed.processes import DaemonProcess


async def soak(
    requests: int, daemons: int, kill_every_s: float, slots: int, partitions: int, seed: int, timeout_s: float, static: bool,
) -> dict[str, object]:
    rng = random.Random(seed)
    env = Environment.start()
    try:
        settings = await env.settings(partitions=partitions, job_slots=slots, progress_interval_s=3600, hub_token=HUB_TOKEN,
                                      max_attempts=3, retry_backoff_s=1)
        ids = [f"soak-{n}" for n in range(requests)]
        landed = await publish_all(settings, [{
            "schema_version": 1, "request_id": request_id, "method": "sft",
            "model": {"id": str(env.model_dir)}, "dataset": {"rows": CHAT_ROWS[:4]},
            "peft": {"r": 2, "lora_alpha": 4, "lora_dropout": 0.0},
            "training": {"max_steps": 2, "per_device_train_batch_size": 2, "save_steps": 1},
            "output": {"repo_id": f"soak/{request_id}"},
        } for request_id in ids])
        # Static membership (deploy/README.md: `group_instance_id` per host): a daemon restarted within
        # session_timeout_ms gets its partitions back, so its jobs resume from its own checkpoints.
        hosts = [settings.model_copy(update={"host": f"soak-{n}", "work_dir": settings.work_dir / f"host-{n}",
                                             "metrics_address": f"127.0.0.1:{free_port()}",
                                             "group_instance_id": f"soak-{n}" if static else None}) for n in range(daemons)]
        running = [DaemonProcess(s, s.work_dir.with_suffix(f".{n}.log")).start() for n, s in enumerate(hosts)]
        kills = 0
        outcomes: dict[str, str] = {}
        all_terminal = asyncio.Event()
        started = time.monotonic()

        async def collect() -> None:
            async with EventStream(settings) as stream:
                async for event in stream.events(until_terminal=False):
                    if event.type in TERMINAL_TYPES and event.request_id is not None:
                        outcomes.setdefault(event.request_id, event.type)
                        if len(outcomes) >= requests:
                            all_terminal.set()

        collector = asyncio.create_task(collect())
        while not all_terminal.is_set() and time.monotonic() - started < timeout_s:
            try:  # the fault schedule, cut short by the last terminal event so "minutes" has no idle tail
                await asyncio.wait_for(all_terminal.wait(), timeout=kill_every_s * rng.uniform(0.5, 1.5))
                break
            except TimeoutError:
                pass
            victim = rng.randrange(daemons)
            running[victim].stop(signal.SIGKILL)
            running[victim] = DaemonProcess(hosts[victim], running[victim].log_path).start()
            kills += 1
        collector.cancel()
        for daemon in running:
            daemon.stop()
        lines = [line for daemon in running for line in daemon.log_lines()]
        # Every step is checkpointed here (save_steps 1). A duplicate training is a request trained to
        # its last step twice (its last checkpoint saved twice); a step checkpointed twice is a step
        # trained again (after a kill, on a host without that checkpoint).
        checkpoints = Counter((line.get("request_id"), line.get("step")) for line in lines if line.get("event") == "job.checkpoint")
        last_step = {request_id: step for (request_id, step) in sorted(checkpoints, key=lambda key: key[1])}
        retrained_steps = {request_id for (request_id, _), count in checkpoints.items() if count > 1}
        retrained = {request_id for request_id, step in last_step.items() if checkpoints[(request_id, step)] > 1}
        starts = Counter(line.get("request_id") for line in lines if line.get("event") == "job.started")
        commits = {request_id: len(env.hub.commits(f"soak/{request_id}")) for request_id in ids}
        # Without a terminal event: lost if its offset was committed anyway, else still waiting in Kafka.
        committed = {partition: await committed_offset(settings, partition) or 0 for partition in range(partitions)}
        unfinished = [request_id for request_id in ids if request_id not in outcomes]
        lost = [request_id for request_id in unfinished if landed[request_id][1] < committed[landed[request_id][0]]]
        return {
            "requests sent": requests,
            "daemons": daemons,
            "partitions, slots per daemon": f"{partitions}, {slots}",
            "static membership (group_instance_id per daemon)": static,
            "daemon kills (SIGKILL)": kills,
            "minutes": round((time.monotonic() - started) / 60, 1),
            "terminal outcomes": dict(Counter(outcomes.values())),
            "requests lost (committed, no terminal event)": len(lost),
            "requests unfinished when the run ended (uncommitted, to be redelivered)": len(unfinished) - len(lost),
            "duplicate Hub commits": sum(1 for count in commits.values() if count > 1),
            "duplicate trainings (trained to the last step twice)": len(retrained),
            "requests with a checkpointed step trained again": len(retrained_steps),
            "requests started more than once (resumed or answered again)": sum(1 for count in starts.values() if count > 1),
        }
    finally:
        env.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--daemons", type=int, default=2)
    parser.add_argument("--slots", type=int, default=1, help="CPU job slots per daemon")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the requests topic")
    parser.add_argument("--kill-every", type=float, default=45.0, help="mean seconds between kills")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-static-membership", dest="static", action="store_false",
                        help="daemons without group_instance_id: a killed one's partitions move after session_timeout_ms")
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    args = parser.parse_args()
    figures = asyncio.run(soak(args.requests, args.daemons, args.kill_every, args.slots, args.partitions, args.seed, args.timeout, args.static))
    for name, value in figures.items():
        print(f"{name:>36}: {value}")


if __name__ == "__main__":
    main()
