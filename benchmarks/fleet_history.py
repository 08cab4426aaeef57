"""A synthetic history of a fleet, for benchmarks/fleet_scale.py: every host's events over some days, signed as
the daemon signs them, and a backlog of waiting requests in the classes' topics, written to a broker in large batches.

The fleet: `gpus` GPUs on hosts of 4, every GPU busy for `days` (a fleet with a backlog), one job after another a
minute apart. A job is one request of one GPU: its `accepted` and `started` (by its host), a `progress` every
`progress_s` and a `checkpoint` every tenth, and its end: `succeeded` (most), `failed` (5%), or `preempted` by an
urgent request (3% of batch jobs; the urgent job then runs on the slot and the preempted request resumes after it,
on the same slot: `accepted`, `started` with `resumed_step`, its end). Each request was told `queued` before it
started (by the host that announces, `gpu-host-000`). The jobs running at the end have no end yet: the fleet's
running jobs. The backlog: `waiting` requests spread over the classes (5% urgent, 35% default, 60% batch) and teams,
arrived over the last two days, each told `queued` soon after it arrived and once more within the last half hour
when it waited longer; each asks for 2 or 4 GPUs at once (fleet_scale's host, of one slot, reads them and can take
none, whatever its view says); `large` of them (default and batch) carry a dataset of just under what a request may
weigh (`max_message_bytes` less the copies' headroom, daemon/kafka/copies.py).

Events are built by the real models (schemas.events), serialized and signed exactly as `Publisher.event_message`
does (`model_dump_json`, the fleet's `EventSigner`, the same headers), keyed by request id, partitioned as the
producer's default partitioner does, each record stamped with its event's time, in time order; signing runs in two
threads beside the building (Ed25519's sign releases the GIL: 21,000/s in one thread here, 22,000 to 33,000/s in
two on these 2 shared cores).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from daemon.kafka.copies import COPY_HEADROOM_BYTES
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from schemas import Accepted, Checkpoint, Failed, Preempted, Progress, Queued, Started, Succeeded
from schemas.events import EventBase
from schemas.signing import SIGNATURE_HEADER, EventSigner
from testbed.data import CHAT_ROWS

CLASSES = ("urgent", "default", "batch")  # highest first; batch preemptible
WAITING_SHARES = {"urgent": 0.05, "default": 0.35, "batch": 0.60}
RUN_SHARES = {"urgent": 0.10, "default": 0.30, "batch": 0.60}
JOB_HOURS = (0.5, 1, 2, 3, 4, 6, 8)  # a job's length, drawn evenly: 3.5 h on average
JOB_GAP_S = 60.0
ANNOUNCER = "gpu-host-000"
GPUS_A_HOST = 4
CHUNK = 20_000  # events built, signed and sent at once
RECENT_S = 2 * 3600.0  # every running job started at most this long (and half an hour) before the end


@dataclass(frozen=True)
class Fleet:
    """The history's shape (module docstring)."""

    gpus: int = 256
    days: float = 7.0
    progress_s: float = 170.0
    waiting: int = 10_000
    large: int = 50
    teams: int = 8
    seed: int = 59

    @property
    def hosts(self) -> int:
        return max(1, self.gpus // GPUS_A_HOST)


@dataclass
class Built:
    """What was written: counted as it was sent."""

    events: int = 0
    requests: int = 0  # distinct request ids with events or waiting
    waiting: int = 0
    large: int = 0
    running: int = 0
    by_type: Counter[str] = field(default_factory=Counter)
    bytes: int = 0
    seconds: float = 0.0
    now: float = 0.0  # the history's present: its last event's time
    done_ids: list[str] = field(default_factory=list)  # a sample of finished requests (for `get`)
    running_teams: Counter[str] = field(default_factory=Counter)

    def as_json(self) -> dict[str, Any]:
        return {**self.__dict__, "by_type": dict(self.by_type), "running_teams": dict(self.running_teams)}


def _team(rng: random.Random, fleet: Fleet) -> str:
    return f"team-{rng.randrange(fleet.teams)}"


def _class(rng: random.Random, shares: dict[str, float]) -> str:
    return rng.choices(list(shares), weights=list(shares.values()))[0]


@dataclass
class _Job:
    request_id: str
    priority_class: str
    team: str
    duration_s: float
    steps: int
    resumed_step: int | None = None


class _Slot:
    """One GPU's jobs, one after the other, as (time, event) in time order."""

    def __init__(self, fleet: Fleet, gpu: int, start: float, end: float, built: Built) -> None:
        self.fleet, self.gpu, self.start, self.end, self.built = fleet, gpu, start, end, built
        self.host = f"gpu-host-{gpu // GPUS_A_HOST:03d}"
        self.rng = random.Random(fleet.seed * 100_003 + gpu)
        self.ids = itertools.count()

    def _new(self, priority_class: str | None = None) -> _Job:
        rng = self.rng
        name = priority_class or _class(rng, RUN_SHARES)
        hours = rng.choice(JOB_HOURS)
        return _Job(f"run-{self.gpu:03d}-{next(self.ids):05d}", name, _team(rng, self.fleet), hours * 3600, 0)

    def _last(self, job: _Job, t: float) -> _Job:
        """A job that would run past the end: ended `RECENT_S` before it, so that the next one starts then; or, when
        it starts that recently already, the slot's running job, of the team `gpu % teams`: every running job started
        within the view's four hours (a kept history is used for an hour), and every team has some."""
        if t < self.end - RECENT_S - 1800 - JOB_GAP_S:
            job.duration_s = self.end - RECENT_S - t - JOB_GAP_S
            return job
        job.team = f"team-{self.gpu % self.fleet.teams}"
        job.duration_s = max(job.duration_s, self.end - t + 3600)
        return job

    def events(self) -> Iterator[tuple[float, EventBase]]:
        rng, t = self.rng, self.start
        resume: list[_Job] = []
        while t < self.end:
            job = resume.pop() if resume else self._new()
            if job.resumed_step is None and t + job.duration_s > self.end:
                job = self._last(job, t)
            job.steps = job.steps or int(job.duration_s / 2)  # a step every 2 s
            queued_at = t - rng.uniform(5, JOB_GAP_S - 5)  # told last within the gap: in time order
            common: dict[str, Any] = {"request_id": job.request_id}
            if job.resumed_step is None:
                self.built.requests += 1
                yield (
                    queued_at,
                    Queued(
                        **common,
                        time=_at(queued_at),
                        host=ANNOUNCER,
                        priority_class=job.priority_class,
                        team=job.team,
                        place=rng.randrange(1, 200),
                        eta_s=round(t - queued_at, 1),
                    ),
                )
            on: dict[str, Any] = {**common, "host": self.host}
            yield (
                t,
                Accepted(
                    **on,
                    time=_at(t),
                    method="sft",
                    priority_class=job.priority_class,
                    team=job.team,
                    host_slots=GPUS_A_HOST,
                    model="Qwen/Qwen2.5-7B-Instruct",
                    max_steps=job.steps,
                ),
            )
            t += 20
            yield (
                t,
                Started(
                    **on,
                    time=_at(t),
                    method="sft",
                    slot=str(self.gpu % GPUS_A_HOST),
                    pid=self.rng.randrange(1000, 4_000_000),
                    resumed_step=job.resumed_step,
                ),
            )
            first = job.resumed_step or 0
            ends = t + job.duration_s * (1 - first / job.steps)
            preempt_at = (
                rng.uniform(t + 600, ends)
                if job.priority_class == "batch"
                and job.resumed_step is None
                and t + 600 < ends < self.end - 2 * RECENT_S
                and rng.random() < 0.03
                else None
            )
            count = 0
            while True:
                t += self.fleet.progress_s
                if t >= min(ends, self.end, preempt_at or ends):
                    break
                step = min(job.steps - 1, first + int((t - (ends - job.duration_s)) / 2))
                count += 1
                yield (
                    t,
                    Progress(
                        **on,
                        time=_at(t),
                        step=step,
                        total_steps=job.steps,
                        epoch=round(step / job.steps * 3, 4),
                        loss=round(rng.uniform(0.2, 2.5), 4),
                        learning_rate=2e-4,
                        grad_norm=round(rng.uniform(0.1, 3), 4),
                        eta_s=round(ends - t, 1),
                        tokens_per_s=round(rng.uniform(2500, 3500), 1),
                    ),
                )
                if count % 10 == 0:
                    yield (
                        t,
                        Checkpoint(
                            **on,
                            time=_at(t),
                            step=step,
                            path=f"/var/lib/adapterd/work/{job.request_id}/checkpoint-{step}",
                        ),
                    )
            if t >= self.end:
                self.built.running += 1
                self.built.running_teams[job.team] += 1
                return
            if preempt_at is not None and t >= preempt_at:
                t = preempt_at
                urgent = self._new("urgent")
                stopped = first + int((t - (ends - job.duration_s)) / 2)
                yield (
                    t,
                    Preempted(
                        **on,
                        time=_at(t),
                        by=urgent.request_id,
                        priority_class=job.priority_class,
                        preemptions=1,
                        stopped_at_step=stopped,
                        resume_from_step=stopped,
                        step=stopped,
                    ),
                )
                job.resumed_step = stopped
                resume += [job, urgent]  # the urgent job first (popped from the end), then this one resumes
                t += JOB_GAP_S
                continue
            t = ends
            if rng.random() < 0.05:
                yield (
                    t,
                    Failed(
                        **on,
                        time=_at(t),
                        code="child_crashed",
                        message="the job's process ended with signal 9",
                        stage="train",
                        retryable=False,
                    ),
                )
            else:
                yield t, _succeeded(on, t, job)
                if len(self.built.done_ids) < 1000 and rng.random() < 0.1:
                    self.built.done_ids.append(job.request_id)
            t += JOB_GAP_S


def _at(t: float) -> datetime:
    return datetime.fromtimestamp(t, UTC)


def _succeeded(on: dict[str, Any], t: float, job: _Job) -> Succeeded:
    """A `succeeded` of the size the fleet publishes (as benchmarks/event_signing.py's)."""
    repo = f"{job.team}/{job.request_id}"
    return Succeeded(
        **on,
        time=_at(t),
        sink="hub",
        repo_id=repo,
        revision="main",
        commit_sha="0" * 40,
        commit_url=f"https://huggingface.co/{repo}/commit/" + "0" * 40,
        location=f"https://huggingface.co/{repo}",
        files=["adapter_config.json", "adapter_model.safetensors", "README.md"],
        metrics={f"metric_{i}": i / 7 for i in range(20)},
        durations_s={f"stage_{i}": i * 1.5 for i in range(16)},
        versions={name: "1.0.0" for name in ("adapterd", "trl", "transformers", "peft", "torch", "datasets")},
        method="sft",
        trainer="SFTTrainer/SFTConfig",
        base_model="Qwen/Qwen2.5-7B-Instruct",
        base_model_revision="1" * 40,
        dataset_fingerprint="f" * 16,
    )


@dataclass(frozen=True)
class Waiting:
    request_id: str
    priority_class: str
    team: str
    arrived: float
    large: bool
    gpus: int


def backlog(fleet: Fleet, now: float) -> list[Waiting]:
    """The waiting requests, in arrival order."""
    rng = random.Random(fleet.seed)
    large = set(rng.sample(range(fleet.waiting), min(fleet.large, fleet.waiting)))
    found = []
    for number in range(fleet.waiting):
        name = _class(rng, WAITING_SHARES)
        if number in large and name == "urgent":
            name = "batch"
        found.append(
            Waiting(
                f"wait-{number:05d}",
                name,
                _team(rng, fleet),
                now - rng.uniform(60, 2 * 86400),
                number in large,
                rng.choice((2, 4)),
            )
        )
    return sorted(found, key=lambda w: w.arrived)


def told(fleet: Fleet, waiting: list[Waiting], now: float) -> Iterator[tuple[float, EventBase]]:
    """The waiting requests' `queued` events, as the announcer told them, in time order."""
    rng = random.Random(fleet.seed + 1)
    places: Counter[str] = Counter()
    said: list[tuple[float, EventBase]] = []
    for w in waiting:
        places[w.priority_class] += 1
        place = places[w.priority_class]
        common: dict[str, Any] = {"request_id": w.request_id, "host": ANNOUNCER, "priority_class": w.priority_class}
        at = w.arrived + 2
        said.append((at, Queued(**common, time=_at(at), team=w.team, place=place, eta_s=round(now - at + 3600, 1))))
        if now - w.arrived > 1800:
            again = now - rng.uniform(0, 1800)
            said.append((again, Queued(**common, time=_at(again), team=w.team, place=place, eta_s=3600.0)))
    said.sort(key=lambda pair: pair[0])
    return iter(said)


def request_body(w: Waiting, max_message_bytes: int) -> bytes:
    """A waiting request's record value: a valid SFT request of its class and team; a large one's rows bring it to
    just under what a request may weigh."""
    body: dict[str, Any] = {
        "schema_version": 1,
        "request_id": w.request_id,
        "method": "sft",
        "team": w.team,
        "priority_class": w.priority_class,
        "model": {"id": "Qwen/Qwen2.5-7B-Instruct"},
        "dataset": {"rows": CHAT_ROWS[:4]},
        "peft": {"r": 16, "lora_alpha": 32, "lora_dropout": 0.05},
        "training": {"max_steps": 1000, "per_device_train_batch_size": 8},
        "resources": {"gpus": w.gpus},
        "output": {"repo_id": f"{w.team}/{w.request_id}"},
    }
    value = json.dumps(body).encode()
    if not w.large:
        return value
    most = max_message_bytes - COPY_HEADROOM_BYTES - len(w.request_id) - 512
    row = json.dumps(CHAT_ROWS[0]).encode()
    rows = list(CHAT_ROWS[:4])
    size = len(value)
    while size + len(row) + 2 < most:
        rows.append(CHAT_ROWS[len(rows) % len(CHAT_ROWS)])
        size += len(json.dumps(rows[-1]).encode()) + 2
    body["dataset"] = {"rows": rows}
    value = json.dumps(body).encode()
    while len(value) > most:
        rows.pop()
        value = json.dumps(body).encode()
    return value


def _message(event: EventBase) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """Key, value and headers as `Publisher.event_message` makes them, less the signature (added in the pool)."""
    value = event.model_dump_json().encode()
    headers = [("adapterd-event-type", event.type.encode()), ("adapterd-schema-version", b"1")]
    return (event.request_id or "").encode(), value, headers


def _sign(signer: EventSigner, values: list[bytes]) -> list[bytes]:
    return [signer.sign(value) for value in values]


def _records(
    chunk: list[tuple[float, EventBase]], messages: list[Any], signed: list[list[bytes]]
) -> list[tuple[int, bytes, bytes, list[tuple[str, bytes]]]]:
    """A chunk's records: (timestamp ms, key, value, headers with the signature)."""
    signatures = signed[0] + signed[1]
    return [
        (int(t * 1000), key, value, [*headers, (SIGNATURE_HEADER, signature)])
        for (t, _), (key, value, headers), signature in zip(chunk, messages, signatures, strict=True)
    ]


class _Sender:
    """Records of one topic in batches of a partition each (as `Publisher.send_all`), acknowledged a chunk at a time."""

    def __init__(self, producer: AIOKafkaProducer, topic: str, partitions: list[int]) -> None:
        self.producer, self.topic, self.partitions = producer, topic, partitions
        self.partitioner = DefaultPartitioner()

    async def send(self, records: list[tuple[int, bytes, bytes, list[tuple[str, bytes]]]]) -> None:
        groups: dict[int, list[tuple[int, bytes, bytes, list[tuple[str, bytes]]]]] = {}
        for record in records:
            groups.setdefault(self.partitioner(record[1], self.partitions, self.partitions), []).append(record)
        acks = []
        for partition, group in groups.items():
            batch = self.producer.create_batch()
            for ms, key, value, headers in group:
                if batch.append(key=key, value=value, timestamp=ms, headers=headers) is None:
                    acks.append(await self.producer.send_batch(batch, self.topic, partition=partition))
                    batch = self.producer.create_batch()
                    batch.append(key=key, value=value, timestamp=ms, headers=headers)
            acks.append(await self.producer.send_batch(batch, self.topic, partition=partition))
        await asyncio.gather(*acks)


async def build(settings: Settings, signer: EventSigner, fleet: Fleet, say: Any = print) -> Built:
    """Write the fleet's history to `settings`' events topic and its backlog to the classes' topics."""
    built = Built()
    started = time.monotonic()
    now = time.time()
    begin = now - fleet.days * 86400
    waiting = backlog(fleet, now)
    streams = [_Slot(fleet, gpu, begin + gpu * 7.0, now, built).events() for gpu in range(fleet.gpus)]
    ordered = heapq.merge(*streams, told(fleet, waiting, now), key=lambda pair: pair[0])
    producer = AIOKafkaProducer(
        **kafka_options(settings),
        acks="all",
        enable_idempotence=True,
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=2 << 20,
    )
    await producer.start()
    loop = asyncio.get_running_loop()
    try:
        events = _Sender(producer, settings.events_topic, sorted(await producer.partitions_for(settings.events_topic)))
        with ThreadPoolExecutor(2, thread_name_prefix="sign") as pool:
            # Three stages at once: chunk i+1 built (the loop's thread), chunk i signed (two threads), chunk i-1 sent.
            signing: tuple[list[tuple[float, EventBase]], list[Any], asyncio.Future[Any]] | None = None
            sending: asyncio.Future[None] | None = None
            while True:
                chunk = list(itertools.islice(ordered, CHUNK))
                messages = [_message(event) for _, event in chunk]
                if signing is not None:
                    records = _records(*signing[:2], await signing[2])
                    built.events += len(records)
                    built.bytes += sum(len(r[2]) for r in records)
                    if sending is not None:
                        await sending
                    sending = asyncio.ensure_future(events.send(records))
                    if built.events % (CHUNK * 10) == 0:
                        rate = built.events / (time.monotonic() - started)
                        say(f"fleet_scale: {built.events:,} events written ({rate:,.0f}/s)")
                if not chunk:
                    break
                for _, event in chunk:
                    built.by_type[event.type] += 1
                built.now = chunk[-1][0]
                values = [value for _, value, _ in messages]
                half = len(values) // 2
                signing = (
                    chunk,
                    messages,
                    asyncio.gather(
                        loop.run_in_executor(pool, _sign, signer, values[:half]),
                        loop.run_in_executor(pool, _sign, signer, values[half:]),
                    ),
                )
            if sending is not None:
                await sending
        built.requests += len(waiting)
        built.waiting = len(waiting)
        for w in waiting:
            topic = settings.class_topics[w.priority_class]
            value = request_body(w, settings.max_message_bytes)
            built.large += w.large
            await producer.send(topic, value, key=w.request_id.encode(), timestamp_ms=int(w.arrived * 1000))
        await producer.flush()
    finally:
        await producer.stop()
    built.seconds = time.monotonic() - started
    return built
