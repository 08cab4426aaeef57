"""Fleet: the fleet as one queue, measured on real daemons; prints one line, `FLEET key=value ...`.

A sweep of `batch` requests of mixed lengths from one team and a smaller one from a second team of twice
its weight (the fair share between teams of one class), then `urgent` requests from a third team once
every slot is busy, on daemons in processes of their own and the local broker (benchmarks/fleet_metrics.py
says what each figure is; `eta_replay_error` is the ETA's error on the run replayed, `replayed_eta_error`).

    uv run python -m benchmarks.fleet               # 2 daemons × 1 slot, 8 + 4 batch (60 to 240 steps)
                                                    # + 2 urgent (4 steps)
    uv run python -m benchmarks.fleet --fifo        # the same on today's partitions: no classes
    uv run python -m benchmarks.fleet --quick       # 4 + 0 batch (2 to 4 steps) + 1 urgent:
                                                    # what tests/test_fleet_bench.py runs
    uv run python -m benchmarks.fleet --contention  # the queue's hard cases (below)

`--contention` is the scenario of the queue's defects (issue 57): the `evals` and urgent teams capped at one
slot each (`max_slots`), a `preempt_min_run_s` of 5 s (longer than the jobs' first seconds), the first urgent
request sent by `adapterd submit` (to the requests topic, as a pipeline sends it) the moment every slot is
busy, so every job is younger than the minimum run, and a second one sent the same way once the first has
started, so it arrives while the first runs and waits for it (its team's cap). Urgent requests train 30 steps there
(about 5 s): the second one's start counts the first one's run.

With `--classes` (the default) the daemons have the classes urgent, default and batch (batch preemptible),
a weight per team, a short preempt_min_run_s, and each request goes to its class's queue topic. With
`--fifo` they have no priority classes: each requests partition is a first-in-first-out queue read by one
host, and a request names no class (the benchmark still counts the sweeps as `batch` and the others as `urgent`).

Each daemon stands for a host: its jobs get the machine's cores over the fleet's slots as their OpenMP
threads (`--threads`), so that one job's steps do not slow another's as they would on hosts sharing cores.

A request arrives at its record's timestamp (set by this producer); the figures come from the events
topic, each host's slots from its settings and the local Hub's commits. Every step is a progress event and
a checkpoint, so a preempted job can resume one step back at most. Not a unit test: it trains for real.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import sys
import time
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, TextIO

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from benchmarks.fleet_metrics import figures, fleet_line
from benchmarks.fleet_timeline import Arrival, Seen, holding, terminal_at
from benchmarks.fleet_watch import Collector, ready
from benchmarks.harness import HUB_TOKEN, Environment
from daemon.fleet.policy.replay import Trace, arrivals_from_events, eta_error
from daemon.kafka.admin.topics import partition_numbers
from daemon.kafka.options import kafka_options
from daemon.local_broker import free_port
from daemon.settings import Settings
from daemon.settings.fleet import PriorityClass, TeamShare
from schemas import Event
from testbed.data import CHAT_ROWS
from testbed.fleet_keys import shared_fleet_keys
from testbed.processes import DaemonProcess, settings_environment

URGENT, BATCH = "urgent", "batch"
CLASSES = [PriorityClass(name=URGENT), PriorityClass(name="default"), PriorityClass(name=BATCH, preemptible=True)]
SWEEP_TEAM, EVALS_TEAM, URGENT_TEAM = "sweep", "evals", "oncall"
WEIGHTS = {SWEEP_TEAM: 1.0, EVALS_TEAM: 2.0, URGENT_TEAM: 1.0}


@dataclass(frozen=True)
class Plan:
    daemons: int = 2
    slots: int = 1  # CPU job slots per daemon
    batch: int = 8
    evals: int = 4  # the second batch team's requests, published with the sweep
    urgent: int = 2
    # Each batch request's max_steps is drawn between these: at about 0.1 s a step on one core here, jobs of 6 to 25 s,
    # the lengths of the jobs measured before each job had its own core (10 to 40 steps of about 0.55 s).
    min_steps: int = 60
    max_steps: int = 240
    urgent_steps: int = 4
    partitions: int = 4  # of each requests topic (ensure_topics gives the claims topic at least 16)
    classes: bool = True
    seed: int = 1
    busy_timeout_s: float = 120  # the urgent requests go anyway if the slots are not all busy by then
    min_run_s: float = 1.0  # preempt_min_run_s
    caps: tuple[tuple[str, int], ...] = ()  # teams' max_slots
    # urgent requests by `adapterd submit`, each once the one before it started; else all at once to their topic
    submit: bool = False
    timeout_s: float = 420  # the run ends then, whatever is unfinished counted lost
    threads: int | None = None  # each job's OpenMP threads; None: this machine's cores over the fleet's slots

    @property
    def total_slots(self) -> int:
        return self.daemons * self.slots


QUICK: dict[str, Any] = {"batch": 4, "evals": 0, "urgent": 1, "min_steps": 2, "max_steps": 4}
CONTENTION: dict[str, Any] = {
    "urgent": 2,
    "urgent_steps": 30,
    "min_run_s": 5.0,
    "caps": ((EVALS_TEAM, 1), (URGENT_TEAM, 1)),
    "submit": True,
}


def job_threads(plan: Plan, cores: int) -> int:
    """Each job's OpenMP threads: `--threads`, else this machine's `cores` over the fleet's slots (at least 1)."""
    return plan.threads or max(1, cores // plan.total_slots)


def fleet_overrides(plan: Plan, suffix: str) -> dict[str, Any]:
    """The fleet's settings with `--classes` (none without: each partition FIFO), with the keys classes need (one
    signing key and one retry key for the fleet)."""
    if not plan.classes:
        return {}
    return {
        **shared_fleet_keys(),
        "priority_classes": CLASSES,
        "default_priority_class": "default",
        "claims_topic": f"claims-{suffix}",
        "teams": {
            team: TeamShare(weight=weight, max_slots=dict(plan.caps).get(team)) for team, weight in WEIGHTS.items()
        },
        "preempt_min_run_s": plan.min_run_s,
        "preempt_max_count": 2,
        "queue_wait_event_s": 1.0,
    }


def request(plan: Plan, model: str, request_id: str, steps: int, priority_class: str, team: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "schema_version": 1,
        "request_id": request_id,
        "method": "sft",
        "team": team,
        "model": {"id": model},
        "dataset": {"rows": CHAT_ROWS[:4]},
        "peft": {"r": 2, "lora_alpha": 4, "lora_dropout": 0.0},
        "training": {"max_steps": steps, "per_device_train_batch_size": 2, "save_steps": 1},
        "output": {"repo_id": f"fleet/{request_id}"},
    }
    if plan.classes:  # a host with no classes rejects a request that names one
        body["priority_class"] = priority_class
    return body


async def publish(
    settings: Settings, topic: str, requests: list[dict[str, Any]], classes: list[str], team: str
) -> list[Arrival]:
    """Publish at once, keyed by request id, each record stamped now: its arrival."""
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        stamped = [(r, int(time.time() * 1000)) for r in requests]
        sent = [
            await producer.send(topic, json.dumps(r).encode(), key=r["request_id"].encode(), timestamp_ms=ms)
            for r, ms in stamped
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()
    return [Arrival(r["request_id"], ms / 1000, name, team) for (r, ms), name in zip(stamped, classes, strict=True)]


class Submit:
    """`adapterd submit` of one request as a pipeline runs it (to the requests topic, with the daemons' settings),
    started ahead and reading its request from a named pipe, so that the request lands the moment it is written
    (`send`), not a Python start-up later: the scenario needs it to land while every job is young."""

    def __init__(self, settings: Settings, request_id: str) -> None:
        self.settings = settings
        self.pipe = settings.work_dir / f"{request_id}.json"
        self.process: asyncio.subprocess.Process | None = None
        self.writer: TextIO | None = None

    async def start(self) -> Submit:
        """Start submit and return once it reads the pipe (its start-up done: a Python start took
        13 to 47 s here under load)."""
        os.mkfifo(self.pipe)
        self.process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "daemon.cli.app",
            "submit",
            str(self.pipe),
            env=settings_environment(self.settings),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        self.writer = await asyncio.to_thread(self.pipe.open, "w")  # opening a pipe to write waits for its reader
        return self

    async def send(self, body: dict[str, Any], team: str) -> Arrival:
        """Write the request; it arrived when its record says (read back at the offset submit printed)."""
        assert self.process is not None and self.writer is not None
        written = time.time()
        with self.writer:
            self.writer.write(json.dumps(body))
        said = (await self.process.communicate())[0].decode()
        found = re.search(r"submitted \S+ to (\S+)\[(\d+)\]@(\d+)", said)
        if self.process.returncode != 0 or found is None:
            raise RuntimeError(f"adapterd submit failed ({self.process.returncode}): {said}")
        tp = TopicPartition(found[1], int(found[2]))
        consumer = AIOKafkaConsumer(**kafka_options(self.settings), enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, int(found[3]))
            record = await consumer.getone(tp)
        finally:
            await consumer.stop()
        # Said, since the scenario depends on it: how long submit took to read the request and to publish it.
        print(
            f"fleet: {body['request_id']} landed {record.timestamp / 1000 - written:.2f}s "
            "after it was written to submit",
            file=sys.stderr,
        )
        return Arrival(body["request_id"], record.timestamp / 1000, body["priority_class"], team)

    def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
        if self.writer is not None:
            self.writer.close()


def started(events: list[Seen], request_id: str) -> bool:
    return any(event.type == "started" and event.request_id == request_id for event in events)


def replayed_eta_error(events: list[Event], arrivals: list[Arrival], slots: int) -> float | None:
    """The ETA's median error on this run replayed (daemon/fleet/policy/replay.py): its measured requests, each of the
    benchmark's class and team (so a run without classes is replayed as the fleet with them would order it),
    through a simulated fleet of as many slots that knows the run's durations ahead, as a fleet that ran such
    jobs before does (cold, every request of a burst before the first end gets no ETA but the first few). None
    when no ETA was given."""
    labels = {a.request_id: a for a in arrivals}
    measured = tuple(
        replace(a, priority_class=labels[a.request_id].priority_class, team=labels[a.request_id].team)
        for a in arrivals_from_events(events)
        if a.request_id in labels
    )
    history = tuple((a.method, a.model, a.duration_s, a.steps) for a in measured)
    error = eta_error(
        Trace(
            measured,
            slots=slots,
            classes=tuple(CLASSES),
            teams={t: TeamShare(weight=w) for t, w in WEIGHTS.items()},
            history=history,
        )
    )
    return None if math.isnan(error) else error


def dump(path: Path, arrivals: list[Arrival], events: list[Seen]) -> None:
    """The run's arrivals and events as the figures read them, one JSON object a line (`--events`)."""
    with path.open("w") as out:
        for kind, items in (("arrival", arrivals), ("event", events)):
            for item in items:
                out.write(json.dumps({"kind": kind, **asdict(item)}) + "\n")


async def run(plan: Plan, bootstrap_servers: str | None = None, events_path: Path | None = None) -> dict[str, object]:
    rng = random.Random(plan.seed)
    env = Environment.start(bootstrap_servers)
    daemons: list[DaemonProcess] = []
    submits: list[Submit] = []
    try:
        suffix = f"{rng.getrandbits(32):08x}"
        settings = await env.settings(
            partitions=plan.partitions,
            job_slots=plan.slots,
            progress_interval_s=0,
            hub_token=HUB_TOKEN,
            max_attempts=3,
            retry_backoff_s=1,
            **fleet_overrides(plan, suffix),
        )
        # The topic the daemons' group reads (ensure_topics made it, and the class queues): the claims with classes.
        group_partitions = len(
            await partition_numbers(settings, settings.claims_topic if plan.classes else settings.requests_topic)
        )
        # One checkpoint store for the fleet (a shared folder here): a job preempted on one host resumes on any other.
        settings = settings.model_copy(
            update={
                "checkpoint_store": str(settings.work_dir / "checkpoint-store"),
                "event_signing_key_file": env.fleet_key(),
            }
        )  # the key signs what hosts write to the store
        hosts = [
            settings.model_copy(
                update={
                    "host": f"fleet-{n}",
                    "work_dir": settings.work_dir / f"host-{n}",
                    "metrics_address": f"127.0.0.1:{free_port()}",
                }
            )
            for n in range(plan.daemons)
        ]
        # Each daemon stands for a host of its own: its jobs get their share of this machine's cores, as a host's get
        # its own, not all of them each (two jobs of 2 OpenMP threads on 2 cores ran their steps 6x slower beside
        # each other than alone, so a job's pace said nothing of the next one's; a fleet's hosts share no cores).
        threads = {"OMP_NUM_THREADS": str(job_threads(plan, os.cpu_count() or 1))}
        daemons = [
            DaemonProcess(s, s.work_dir.with_suffix(f".{n}.log"), extra_env=threads).start()
            for n, s in enumerate(hosts)
        ]
        collector = Collector(settings)
        collecting = asyncio.create_task(collector.run())
        await ready(daemons, settings, group_partitions)

        def topic(name: str) -> str:
            return settings.class_topics[name] if plan.classes else settings.requests_topic

        model = str(env.model_dir)
        submits = [await Submit(settings, f"urgent-{n}").start() for n in range(plan.urgent if plan.submit else 0)]
        sweep = [
            request(plan, model, f"batch-{n}", rng.randint(plan.min_steps, plan.max_steps), BATCH, SWEEP_TEAM)
            for n in range(plan.batch)
        ]
        sent = time.monotonic()
        evals = [
            request(plan, model, f"evals-{n}", rng.randint(plan.min_steps, plan.max_steps), BATCH, EVALS_TEAM)
            for n in range(plan.evals)
        ]
        arrivals = await publish(settings, topic(BATCH), sweep, [BATCH] * len(sweep), SWEEP_TEAM)
        arrivals += await publish(settings, topic(BATCH), evals, [BATCH] * len(evals), EVALS_TEAM)
        busy_s = min(plan.busy_timeout_s, plan.timeout_s)
        if not await collector.until(lambda events: holding(events) >= plan.total_slots, busy_s):
            print(f"fleet: not every slot was busy after {busy_s}s; the urgent requests go now", file=sys.stderr)
        urgent = [
            request(plan, model, f"urgent-{n}", plan.urgent_steps, URGENT, URGENT_TEAM) for n in range(plan.urgent)
        ]
        if plan.submit:
            for n, body in enumerate(urgent):
                before = str(urgent[n - 1]["request_id"])
                if n and not await collector.until(partial(started, request_id=before), busy_s):
                    print(f"fleet: {before} had not started after {busy_s}s; the next goes now", file=sys.stderr)
                arrivals.append(await submits[n].send(body, URGENT_TEAM))
        else:
            arrivals += await publish(settings, topic(URGENT), urgent, [URGENT] * len(urgent), URGENT_TEAM)
        ids = {arrival.request_id for arrival in arrivals}
        end = None  # all ended: the last event of theirs; else now, the run's end with some unfinished
        if not await collector.until(
            lambda events: ids <= set(terminal_at(events)), plan.timeout_s - (time.monotonic() - sent)
        ):
            print(f"fleet: not every request ended within {plan.timeout_s}s", file=sys.stderr)
            end = time.time()
        collecting.cancel()
        commits = {request_id: len(env.hub.commits(f"fleet/{request_id}")) for request_id in ids}
        result = figures(
            arrivals,
            collector.events,
            {h.host: h.job_slots for h in hosts},
            [c.name for c in CLASSES],
            WEIGHTS,
            commits,
            end=end,
            caps=dict(plan.caps),
        )
        end = end or max(e.at for e in collector.events if e.request_id in ids)
        if events_path is not None:
            dump(events_path, arrivals, collector.events)
        return {
            **result,
            "eta_replay_error": replayed_eta_error(collector.raw, arrivals, plan.total_slots),
            "mode": "classes" if plan.classes else "fifo",
            "daemons": plan.daemons,
            "slots_each": plan.slots,
            "batch": plan.batch,
            "evals": plan.evals,
            "urgent": plan.urgent,
            "makespan_s": end - min(a.at for a in arrivals),
            "preempt_min_run_s": plan.min_run_s,
            "caps": ",".join(f"{t}:{n}" for t, n in plan.caps) or None,
            "urgent_by": "submit" if plan.submit else "producer",
        }
    finally:
        for submit in submits:
            submit.stop()
        for daemon in daemons:
            daemon.stop()
        env.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--daemons", type=int, default=Plan.daemons)
    parser.add_argument("--slots", type=int, default=Plan.slots, help="CPU job slots per daemon")
    parser.add_argument("--batch", type=int, default=None, help="the sweep's size (batch requests)")
    parser.add_argument(
        "--evals", type=int, default=None, help="the second batch team's requests (twice the sweep's weight)"
    )
    parser.add_argument("--urgent", type=int, default=None, help="urgent requests, sent once every slot is busy")
    parser.add_argument("--min-steps", type=int, default=None)
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--partitions", type=int, default=Plan.partitions)
    modes = parser.add_mutually_exclusive_group()
    modes.add_argument(
        "--classes", action="store_true", default=True, help="the fleet's priority classes and teams (the default)"
    )
    modes.add_argument(
        "--fifo", dest="classes", action="store_false", help="no classes: each partition first-in-first-out"
    )
    parser.add_argument("--quick", action="store_true", help=f"a small run: {QUICK}")
    parser.add_argument(
        "--contention",
        action="store_true",
        help=f"the queue's hard cases (a team cap, a long minimum run, urgent by submit): {CONTENTION}",
    )
    parser.add_argument("--seed", type=int, default=Plan.seed)
    parser.add_argument("--timeout", type=float, default=Plan.timeout_s)
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="each job's OpenMP threads (default: this machine's cores over the fleet's slots)",
    )
    parser.add_argument(
        "--bootstrap-servers", default=None, help="a running broker's (a test's) instead of one of the run's own"
    )
    parser.add_argument(
        "--events", type=Path, default=None, help="write the run's arrivals and events here, one JSON object a line"
    )
    args = parser.parse_args()
    plan = Plan(
        daemons=args.daemons,
        slots=args.slots,
        partitions=args.partitions,
        classes=args.classes,
        seed=args.seed,
        timeout_s=args.timeout,
        threads=args.threads,
    )
    if args.quick:
        plan = replace(plan, **QUICK)
    if args.contention:
        plan = replace(plan, **CONTENTION)
    given: dict[str, Any] = {
        "batch": args.batch,
        "evals": args.evals,
        "urgent": args.urgent,
        "min_steps": args.min_steps,
        "max_steps": args.max_steps,
    }
    plan = replace(plan, **{name: value for name, value in given.items() if value is not None})
    print(fleet_line(asyncio.run(run(plan, args.bootstrap_servers, args.events))), flush=True)


if __name__ == "__main__":
    main()
