"""One way to decode a request (daemon/decoding.py), on the fakes: intake, the dispatcher's heads, the announcer and
the CLI's list of waiting requests give a record the same verdict (a credential only the daemon's scanner knows, a
request too large for the daemon's copies); a class topic of large records never holds the loop, in the dispatcher's
turn or the announcer's round (a slow decode constructed, the loop's lag measured); and the announcer decodes each
record once across its rounds, forgetting what its group has committed past (issue 59)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from daemon import decoding
from daemon.cli.waiting import Queue, from_record
from daemon.fleet.announcer import Announcer
from daemon.fleet.dispatcher import Dispatcher
from daemon.kafka.copies import COPY_HEADROOM_BYTES
from daemon.kafka.records import Record
from daemon.settings import Settings
from daemon.settings.fleet import queue_group
from schemas import Rejection, RequestBase
from tests.core import CoreOnFakes
from tests.daemon.core.test_fleet_core import host, settings  # noqa: F401  (the fleet's settings fixture)
from tests.fakes import FakeRecord
from tests.helpers import sft_request

SLOW_S = 0.3  # the constructed decode's time, each record


def large(request_id: str, priority_class: str = "batch") -> bytes:
    """A valid request of OFF_LOOP_BYTES or more (its rows' text), within the daemon's copies' bound."""
    rows = [{"text": "word " * 18} for _ in range(decoding.OFF_LOOP_BYTES // 90)]
    value = json.dumps(sft_request(request_id, priority_class=priority_class, dataset={"rows": rows})).encode()
    assert decoding.OFF_LOOP_BYTES <= len(value) < 1_048_576 - COPY_HEADROOM_BYTES
    return value


def slowed(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """From now, each decode takes SLOW_S (a sleep, as a long parse would hold its thread); the threads that ran
    them."""
    ran: list[str] = []
    decoded_now = decoding.decoded_now

    def slow(record: Record, max_message_bytes: int) -> RequestBase | Rejection:
        ran.append(threading.current_thread().name)
        time.sleep(SLOW_S)
        return decoded_now(record, max_message_bytes)

    monkeypatch.setattr(decoding, "decoded_now", slow)
    return ran


@contextlib.asynccontextmanager
async def loop_lag() -> AsyncIterator[Callable[[], float]]:
    """The largest gap between a probe task's wake-ups while the block runs (it asks for one every 5 ms). The
    collector is off meanwhile: a collection of the test process's objects stops every thread, the loop's too, and
    is not what is measured."""
    gaps = [0.0]
    loop = asyncio.get_running_loop()

    async def probe() -> None:
        last = loop.time()
        while True:
            await asyncio.sleep(0.005)
            now = loop.time()
            gaps.append(now - last)
            last = now

    gc.collect()
    gc.disable()
    task = asyncio.create_task(probe())
    await asyncio.sleep(0)
    try:
        yield lambda: max(gaps)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        gc.enable()


def announcer_of(core: CoreOnFakes, dispatcher: Dispatcher) -> Announcer:
    return Announcer(
        core.settings,
        dispatcher.view,
        core.publisher,
        core.partitions,
        dispatcher.retries,
        core.fleet.kafka().reads,
        core.scheduler.cancelled,
    )


async def test_a_class_topic_of_large_records_never_holds_the_loop_in_a_turn_or_a_round(
    settings: Settings,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core, dispatcher = host(settings.model_copy(update={"job_slots": 2}), claims_partitions=3)
    small = json.dumps(sft_request("small", priority_class="batch")).encode()
    core.fleet.produce(settings.class_topics["batch"], b"small", small)
    for _ in range(3):  # a first claim, of a small request: what a first claim does once is done
        await dispatcher.turn()
    assert [claim.key for claim in core.fleet.on(settings.claims_topic)] == [b"small"]
    slow_decode = slowed(monkeypatch)
    for index in range(3):
        core.fleet.produce(settings.class_topics["batch"], f"big-{index}".encode(), large(f"big-{index}"))
    async with loop_lag() as lag:
        for _ in range(3):  # joins the queue, reads its window, claims the first for its free slot
            await dispatcher.turn()
    assert core.fleet.on(settings.claims_topic)[1].key == b"big-0"  # the turn went on past the slow decodes
    assert len(slow_decode) == 3 and lag() < SLOW_S / 3, (lag(), slow_decode)
    slow_decode.clear()
    async with loop_lag() as lag:
        await announcer_of(core, dispatcher).announce()
    assert len(slow_decode) == 2 and lag() < SLOW_S / 3, (lag(), slow_decode)  # big-0 claimed: 2 left
    assert threading.current_thread().name not in slow_decode  # every decode in a worker thread


async def test_the_announcer_decodes_each_record_once_across_rounds_and_forgets_what_is_committed_past(
    settings: Settings,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    core, dispatcher = host(settings)
    topic = settings.class_topics["batch"]
    decoded: list[tuple[int, int]] = []
    decoded_now = decoding.decoded_now

    def counted(record: Record, max_message_bytes: int) -> RequestBase | Rejection:
        decoded.append((record.partition, record.offset))
        return decoded_now(record, max_message_bytes)

    monkeypatch.setattr(decoding, "decoded_now", counted)
    for index in range(5):
        value = json.dumps(sft_request(f"w-{index}", priority_class="batch")).encode()
        core.fleet.produce(topic, f"w-{index}".encode(), value)
    core.fleet.produce(topic, b"junk", b"{not json")  # no request: not decoded again either
    announcer = announcer_of(core, dispatcher)
    for _ in range(3):
        unread = await announcer.unread()
    assert sorted(decoded) == [(0, offset) for offset in range(6)]
    assert [each.waiting.request_id for each in unread] == [f"w-{index}" for index in range(5)]
    core.fleet.produce(topic, b"w-5", json.dumps(sft_request("w-5", priority_class="batch")).encode())
    # Two claimed by another host: its group committed past them.
    core.fleet.offsets[(queue_group(settings.group_id, "batch"), TopicPartition(topic, 0))] = 2
    unread = await announcer.unread()
    assert sorted(decoded) == [(0, offset) for offset in range(7)]  # only the new one read and decoded
    assert [each.waiting.request_id for each in unread] == ["w-2", "w-3", "w-4", "w-5"]
    assert sorted(announcer.unreads.kept[topic][0]) == [2, 3, 4, 5, 6]  # what is behind the offset forgotten


CASES = {
    # A credential only the daemon's scanner (detect-secrets' keyword list) knows: schemas' built-in rules let it by.
    "credential": (sft_request("credential", priority_class="batch", metadata={"pwd": "short"}), "secret_in_request"),
    # Valid, but its retry and DLQ copies would not fit the brokers' largest record.
    "oversize": (
        sft_request("oversize", priority_class="batch", dataset={"rows": [{"text": "x" * 60_000}, {"text": "b"}]}),
        "policy",
    ),
}


@pytest.fixture
def bounded(settings: Settings) -> Iterator[Settings]:  # noqa: F811
    """The fleet's settings with the smallest record the brokers may take (65,536 bytes)."""
    yield settings.model_copy(update={"max_message_bytes": 65_536})


@pytest.mark.parametrize("case", sorted(CASES))
async def test_intake_the_dispatcher_the_announcer_and_the_cli_give_a_record_the_same_verdict(
    bounded: Settings, case: str
) -> None:
    document, reason = CASES[case]
    value = json.dumps(document).encode()
    request_id = str(document["request_id"])
    # Intake, of a host without classes (with them it reads only claims the fleet signed).
    plain = CoreOnFakes(bounded.model_copy(update={"priority_classes": []}))
    await plain.intake.take(plain.tp, [FakeRecord(plain.tp.topic, 0, 0, request_id.encode(), value)])
    await plain.partitions.settled(plain.tp)
    [rejected] = plain.events(request_id)
    assert rejected["type"] == "rejected" and rejected["reason"] == reason
    core, dispatcher = host(bounded)
    # The dispatcher, at its class topic's head.
    queued = core.fleet.produce(bounded.class_topics["batch"], request_id.encode(), value)
    batch = next(queue for queue in dispatcher.queues if queue.name == "batch")
    head = await dispatcher.heads.read(batch, TopicPartition(queued.topic, 0), queued)
    assert head.rejection is not None and head.rejection.reason == reason
    assert [e.path for e in head.rejection.errors] == [e["path"] for e in rejected["errors"]]  # type: ignore[union-attr]
    # The announcer: no request to tell it waits.
    assert await announcer_of(core, dispatcher).unread() == []
    # The CLI's waiting list: not a request, which the daemon that reads it rejects.
    listed = from_record(Queue("g", queued.topic, "unread", "batch"), queued, bounded)
    assert listed.stage == "undecodable" and reason in listed.detail
    # And it never took a claim.
    for _ in range(3):
        await dispatcher.turn()
    assert core.fleet.on(bounded.claims_topic) == [] and core.types(request_id) == ["rejected"]


def test_a_request_is_decoded_in_a_thread_from_off_loop_bytes(tmp_path: Path) -> None:
    small = FakeRecord("t", 0, 0, b"s", json.dumps(sft_request("s")).encode())
    assert isinstance(decoding.decoded_on_loop(small, 1_048_576), RequestBase)
    assert decoding.decoded_on_loop(FakeRecord("t", 0, 1, b"b", large("b")), 1_048_576) is None  # left to the thread


async def test_the_announcers_places_of_thousands_waiting_never_hold_the_loop(
    settings: Settings,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 59: with 10,000 waiting, the announcer's places (the fleet's order, its preemptions and ETAs) held the loop
    half a second every round it worked them out. Made slow here (a sleep of SLOW_S, not this machine's speed), they
    are worked out in the `order` pool's thread while the loop turns."""
    import daemon.fleet.view as view_module

    core, dispatcher = host(settings)
    for index in range(3):
        value = json.dumps(sft_request(f"w-{index}", priority_class="batch")).encode()
        core.fleet.produce(settings.class_topics["batch"], f"w-{index}".encode(), value)
    ran: list[str] = []
    places = view_module.places

    def slow(*args: object) -> object:
        ran.append(threading.current_thread().name)
        time.sleep(SLOW_S)
        return places(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(view_module, "places", slow)
    announcer = announcer_of(core, dispatcher)
    async with loop_lag() as lag:
        told = await announcer.announce()
    assert told == 3 and ran and all(name.startswith("adapterd-order") for name in ran), ran
    assert lag() < SLOW_S / 3, lag()
