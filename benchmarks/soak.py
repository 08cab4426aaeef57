"""Soak: many small requests while daemons are killed (SIGKILL) and restarted at random.

    uv run python -m benchmarks.soak --requests 300 --daemons 2 --kill-every 45

Prints what the promise is about: requests sent, terminal outcomes, requests lost (committed without
a terminal event, judged per partition from the group's committed offsets), requests still
unfinished when the run ended (uncommitted), duplicate Hub commits (more than one commit for a
request id), duplicate trainings (a request trained to its last step twice) and requests with a
checkpointed step trained again (a retry resumes from the last checkpoint on the same host; on
another host it starts over, unless a checkpoint store holds it), and how many requests were started more than once. The
daemons use static membership by default, as deploy/README.md advises (`--no-static-membership` to leave it out). Not a
unit test: it runs for as long as it takes.

`--checkpoint-store` gives the daemons one checkpoint store on a local S3 server (moto's, in a process
of its own); `--lose-host-after S` SIGKILLs the first daemon S seconds in and never restarts it (a
host lost for good: its partitions go to the others once its session times out), the others going on
(random kills, if any, only among them). With a store, a step counts as trained again when it was
checkpointed where the host that trained it again could see it: on that host's disk, or in the store.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from benchmarks.harness import HUB_TOKEN, Environment, publish_all
from daemon.kafka.event_reader import EventStream
from daemon.local_broker import free_port
from schemas import TERMINAL_TYPES
from testbed.client import committed_offset
from testbed.data import CHAT_ROWS
from testbed.processes import DaemonProcess

S3_ENV = {"AWS_ACCESS_KEY_ID": "soak", "AWS_SECRET_ACCESS_KEY": "soak", "AWS_DEFAULT_REGION": "us-east-1"}


@contextmanager
def s3_server(bucket: str = "soak") -> Iterator[str]:
    """moto's S3 server in a process of its own (in this one it would take a trainer's GIL, as no real
    store does), with `bucket`: its endpoint."""
    import boto3

    os.environ.update(S3_ENV)
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        for _ in range(150):
            try:
                boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
                break
            except Exception:  # not listening yet
                time.sleep(0.2)
        yield endpoint
    finally:
        server.terminate()
        server.wait()


async def soak(
    requests: int,
    daemons: int,
    kill_every_s: float,
    slots: int,
    partitions: int,
    seed: int,
    timeout_s: float,
    static: bool,
    store_endpoint: str | None = None,
    lose_after_s: float | None = None,
) -> dict[str, object]:
    rng = random.Random(seed)
    env = Environment.start()
    try:
        store = (
            {
                "checkpoint_store": "s3://soak/checkpoints",
                "event_signing_key_file": env.fleet_key(),
                "dataset_storage_options": {"s3": {"client_kwargs": {"endpoint_url": store_endpoint}}},
            }
            if store_endpoint
            else {}
        )
        settings = await env.settings(
            partitions=partitions,
            job_slots=slots,
            progress_interval_s=3600,
            hub_token=HUB_TOKEN,
            max_attempts=3,
            retry_backoff_s=1,
            **store,
        )
        ids = [f"soak-{n}" for n in range(requests)]
        landed = await publish_all(
            settings,
            [
                {
                    "schema_version": 1,
                    "request_id": request_id,
                    "method": "sft",
                    "model": {"id": str(env.model_dir)},
                    "dataset": {"rows": CHAT_ROWS[:4]},
                    "peft": {"r": 2, "lora_alpha": 4, "lora_dropout": 0.0},
                    "training": {"max_steps": 2, "per_device_train_batch_size": 2, "save_steps": 1},
                    "output": {"repo_id": f"soak/{request_id}"},
                }
                for request_id in ids
            ],
        )
        # Static membership (deploy/README.md: `group_instance_id` per host): a daemon restarted within
        # session_timeout_ms gets its partitions back, so its jobs resume from its own checkpoints.
        hosts = [
            settings.model_copy(
                update={
                    "host": f"soak-{n}",
                    "work_dir": settings.work_dir / f"host-{n}",
                    "metrics_address": f"127.0.0.1:{free_port()}",
                    "group_instance_id": f"soak-{n}" if static else None,
                }
            )
            for n in range(daemons)
        ]
        extra_env = S3_ENV if store_endpoint else {}
        running = [
            DaemonProcess(s, s.work_dir.with_suffix(f".{n}.log"), extra_env=extra_env).start()
            for n, s in enumerate(hosts)
        ]
        kills = 0
        lost_host = False
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
            wait = kill_every_s * rng.uniform(0.5, 1.5) if kill_every_s > 0 else timeout_s
            if lose_after_s is not None and not lost_host:
                wait = min(wait, max(0.0, started + lose_after_s - time.monotonic()))
            try:  # the fault schedule, cut short by the last terminal event so "minutes" has no idle tail
                await asyncio.wait_for(all_terminal.wait(), timeout=wait)
                break
            except TimeoutError:
                pass
            if lose_after_s is not None and not lost_host and time.monotonic() >= started + lose_after_s:
                running[0].stop(signal.SIGKILL)  # lost for good: never restarted
                lost_host = True
                kills += 1
                continue
            victim = rng.randrange(1 if lose_after_s is not None else 0, daemons)
            running[victim].stop(signal.SIGKILL)
            running[victim] = DaemonProcess(hosts[victim], running[victim].log_path, extra_env=extra_env).start()
            kills += 1
        collector.cancel()
        for daemon in running:
            daemon.stop()
        by_host = [(n, line) for n, daemon in enumerate(running) for line in daemon.log_lines()]
        lines = [line for _, line in by_host]
        # Every step is checkpointed here (save_steps 1). A duplicate training is a request trained to
        # its last step twice (its last checkpoint saved twice); a step checkpointed twice is a step
        # trained again (after a kill, on a host without that checkpoint) where the host that trained
        # it again could have resumed from it: its own disk, or the store once it was uploaded there.
        checkpoints = Counter(
            (line.get("request_id"), line.get("step")) for line in lines if line.get("event") == "job.checkpoint"
        )
        saved_on: dict[tuple[object, object], list[int]] = defaultdict(list)
        for n, line in by_host:
            if line.get("event") == "job.checkpoint":
                saved_on[(line.get("request_id"), line.get("step"))].append(n)
        stored = {
            (line.get("request_id"), line.get("step"))
            for line in lines
            if line.get("event") == "checkpoint_store.uploaded"
        }
        last_step = {request_id: step for (request_id, step) in sorted(checkpoints, key=lambda key: key[1])}
        retrained_steps = {
            request_id
            for key, hosts_of in saved_on.items()
            if len(hosts_of) > 1
            for request_id in [key[0]]
            if key in stored or len(set(hosts_of)) < len(hosts_of)
        }
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
            "host lost for good (SIGKILLed, never restarted)": lost_host,
            "checkpoint store": "s3 (moto, local)" if store_endpoint else "none",
            "minutes": round((time.monotonic() - started) / 60, 1),
            "terminal outcomes": dict(Counter(outcomes.values())),
            "requests lost (committed, no terminal event)": len(lost),
            "requests unfinished when the run ended (uncommitted, to be redelivered)": len(unfinished) - len(lost),
            "duplicate Hub commits": sum(1 for count in commits.values() if count > 1),
            "duplicate trainings (trained to the last step twice)": len(retrained),
            "requests with a checkpointed step trained again": len(retrained_steps),
            "requests started more than once (resumed or answered again)": sum(
                1 for count in starts.values() if count > 1
            ),
        }
    finally:
        env.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--daemons", type=int, default=2)
    parser.add_argument("--slots", type=int, default=1, help="CPU job slots per daemon")
    parser.add_argument("--partitions", type=int, default=4, help="partitions of the requests topic")
    parser.add_argument("--kill-every", type=float, default=45.0, help="mean seconds between kills (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--no-static-membership",
        dest="static",
        action="store_false",
        help="daemons without group_instance_id: a killed one's partitions move after session_timeout_ms",
    )
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    parser.add_argument(
        "--checkpoint-store", action="store_true", help="one checkpoint store for the daemons, on a local S3 server"
    )
    parser.add_argument(
        "--lose-host-after",
        type=float,
        default=None,
        help="SIGKILL the first daemon this many seconds in and never restart it; --kill-every 0: no other kills",
    )
    args = parser.parse_args()
    with s3_server() if args.checkpoint_store else nullcontext() as endpoint:
        figures = asyncio.run(
            soak(
                args.requests,
                args.daemons,
                args.kill_every,
                args.slots,
                args.partitions,
                args.seed,
                args.timeout,
                args.static,
                endpoint,
                args.lose_host_after,
            )
        )
    for name, value in figures.items():
        print(f"{name:>36}: {value}")


if __name__ == "__main__":
    main()
