"""A daemon's view of the fleet loads from the table of requests and the events past it, against a real broker
(daemon/fleet/view.py `FleetView.follow`): a history of signed events, its table's entries written to the state topic
and the keepers' offsets committed at its end, as the table's keepers write and commit them; then
more events. The view is whole as every event of the window says, having read only the tail of the events topic; and
loading a large table, the event loop waits on none of the verifying, parsing or folding."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

import daemon.table.reader
from daemon import executors
from daemon.fleet import view as view_module
from daemon.fleet.view import USAGE_LOOKBACK_S, FleetView, Folds
from daemon.kafka.options import kafka_options
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.secret_files import event_signer
from daemon.table.codec import entry_headers, entry_value
from daemon.table.entry import TableEntry
from daemon.table.topic import COMPACTED, keeper_group
from schemas import Event
from schemas.signing import SIGNATURE_HEADER
from testbed.fleet_keys import shared_fleet_keys
from tests.daemon.fleet.test_fleet_view_table import (
    NOW,
    accepted,
    decisions,
    every_event,
    history,
    progress,
    queued,
    started,
    succeeded,
    table,
)


@pytest.fixture
async def fleet(settings: Settings) -> Settings:
    """The test's settings with the fleet's keys, and its state topic made as `adapterd topics` makes it."""
    fleet = settings.model_copy(update={"state_topic": f"state-{settings.group_id}", **shared_fleet_keys()})
    admin = AIOKafkaAdminClient(**kafka_options(fleet))
    await admin.start()
    try:
        await admin.create_topics([NewTopic(fleet.state_topic, 1, 1, topic_configs=COMPACTED)])
    except TopicAlreadyExistsError:
        pass
    finally:
        await admin.close()
    return fleet


async def publish(settings: Settings, events: Sequence[Event], stamped: bool = False) -> list[int]:
    """The events as the fleet's hosts publish them, signed and keyed by their request: their offsets (`stamped`: the
    records' timestamps their events' times, as for events published then; else now)."""
    signer = event_signer(settings)
    assert signer is not None
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        offsets = []
        for event in events:
            value = event.model_dump_json().encode()
            sent = await producer.send_and_wait(
                settings.events_topic,
                value,
                key=(event.request_id or "").encode(),
                partition=0,
                headers=[(SIGNATURE_HEADER, signer.sign(value))],
                timestamp_ms=int(event.time.timestamp() * 1000) if stamped else None,
            )
            offsets.append(sent.offset)
        return offsets
    finally:
        await producer.stop()


async def keep(settings: Settings, entries: Sequence[TableEntry], committed: int) -> None:
    """What the keepers do: write each entry, signed, to the state topic, then commit the events read to there."""
    signer = event_signer(settings)
    producer = AIOKafkaProducer(**kafka_options(settings), acks="all")
    await producer.start()
    try:
        for entry in entries:
            value = entry_value(entry)
            await producer.send_and_wait(
                settings.state_topic,
                value,
                key=entry.request_id.encode(),
                partition=entry.partition,
                headers=entry_headers(value, signer),
            )
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        **kafka_options(settings), group_id=keeper_group(settings.group_id), enable_auto_commit=False
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(settings.events_topic, 0)])
        await consumer.commit({TopicPartition(settings.events_topic, 0): committed})
    finally:
        await consumer.stop()


async def tabled(settings: Settings, events: Sequence[Event]) -> None:
    """The events published, their table written and the keepers' offsets committed past them."""
    offsets = await publish(settings, events)
    await keep(
        settings, table([(event, 0, offset) for event, offset in zip(events, offsets, strict=True)]), len(events)
    )


def starts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[int, int]]]:
    """Where each reader of a topic began, partition by partition, as they start."""
    began: list[tuple[str, dict[int, int]]] = []
    start = TopicReader.start

    async def noted(reader: TopicReader) -> TopicReader:
        await start(reader)
        began.append((reader.topic, {tp.partition: offset for tp, offset in reader.next_offset.items()}))
        return reader

    monkeypatch.setattr(TopicReader, "start", noted)
    return began


async def test_a_restarted_view_is_whole_from_the_table_and_reads_only_the_tail_of_the_events(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    past = history()
    await tabled(fleet, past)
    more = [
        accepted("tail-1", "gpu-b", 60, host_slots=2),
        started("tail-1", "gpu-b", 55),
        progress("r1", "gpu-a", 30, 45, eta_s=550.0),
        queued("w2", "gpu-b", 20, 1, 200.0),
    ]
    await publish(fleet, more)
    began = starts(monkeypatch)

    view = FleetView(fleet)
    following = asyncio.create_task(view.follow())
    try:
        await asyncio.wait_for(view.caught_up.wait(), 60)
        whole = every_event([*past, *more])
        assert decisions(view) == decisions(whole)
        assert view.usage.slot_seconds(NOW) == pytest.approx(whole.usage.slot_seconds(NOW), rel=1e-9)
        assert sorted(job.request_id for job in view.running_jobs.jobs(NOW)) == ["pre", "r1", "tail-1", "urgent-1"]
        # Followed: an event published now is folded (verified in the worker threads, a poll's records at a time).
        await publish(fleet, [succeeded("tail-1", "gpu-b", 0, 55.0)])
        async with asyncio.timeout(30):
            while "tail-1" in {job.request_id for job in view.running_jobs.jobs(time.time())}:
                await asyncio.sleep(0.05)
        assert view.usage.running() == {"vision": 3, "text": 2}
        # The events topic read from the keepers' committed offset (the tail) and followed on; the state topic once.
        events_read = [offsets for topic, offsets in began if topic == fleet.events_topic]
        assert events_read == [{0: len(past)}]  # one reader: the tail, then followed on
        assert [topic for topic, _ in began].count(fleet.state_topic) == 1
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_with_no_table_the_view_reads_the_events_of_the_window(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No keeper has run (no entry, no committed offset: the table made since, or not at all): the view reads the
    events of the window, as it did before the table, not the whole topic."""
    past = history()
    await publish(fleet, past, stamped=True)
    began = starts(monkeypatch)
    view = FleetView(fleet)
    following = asyncio.create_task(view.follow())
    try:
        await asyncio.wait_for(view.caught_up.wait(), 60)
        assert decisions(view) == decisions(every_event(past))
        first = next(n for n, event in enumerate(past) if event.time.timestamp() >= time.time() - USAGE_LOOKBACK_S - 60)
        assert first > 0 and [offsets for topic, offsets in began if topic == fleet.events_topic] == [{0: first}]
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


async def test_a_table_still_catching_up_leaves_the_view_the_events_of_the_window_not_the_history(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 59: the table deployed on a fleet with a history, its keepers have committed only its first events: a
    daemon started then read every event from there (a week's, minutes), where the events before the window say
    nothing the view folds that the window does not say again. It reads from the later of the two."""
    past = history()
    offsets = await publish(fleet, past, stamped=True)
    await keep(fleet, table([(past[0], 0, offsets[0])]), 1)
    began = starts(monkeypatch)
    view = FleetView(fleet)
    following = asyncio.create_task(view.follow())
    try:
        await asyncio.wait_for(view.caught_up.wait(), 60)
        first = next(n for n, event in enumerate(past) if event.time.timestamp() >= time.time() - USAGE_LOOKBACK_S - 60)
        assert first > 1 and [offsets for topic, offsets in began if topic == fleet.events_topic] == [{0: first}]
        assert decisions(view) == decisions(every_event(past))
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)


def slowed(function: Callable[..., Any], seconds: float) -> Callable[..., Any]:
    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return function(*args, **kwargs)

    return slow


async def test_loading_a_large_table_holds_the_event_loop_for_none_of_its_work(
    fleet: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each entry's verify and parse, each event's of the tail, and each event's fold made slow (a thread's sleep,
    not this machine's speed): any part of the work done on the loop would hold it 0.75 s and more, where the loop
    is held at most a tenth of that plus what a busy machine's scheduler costs (the threads' own start among it)."""
    requests, tail = 200, 200
    past = [
        each
        for n in range(requests)
        for each in (accepted(f"r{n}", "gpu-a", 900, host_slots=8), started(f"r{n}", "gpu-a", 890))
    ]
    await tabled(fleet, past)
    await publish(fleet, [progress(f"r{n}", "gpu-a", 10, 5, eta_s=100.0) for n in range(tail)])
    threads = executors.THREADS["verify"]
    # A worker thread's chunk of the entries (requests / threads of them): 1.5 s; of the tail's events: 0.75 s.
    entry_s, event_s = 1.5 * threads / requests, 0.75 * threads / tail
    monkeypatch.setattr(daemon.table.reader, "read_entry", slowed(daemon.table.reader.read_entry, entry_s))
    monkeypatch.setattr(view_module, "checked", slowed(view_module.checked, event_s))
    observe, oldest = slowed(Folds.observe, 1.5 / (2 * requests)), []  # the table's folds 1.5 s, the tail's 0.75

    def noted(folds: Folds, event: Event, now: float) -> None:
        oldest.append(gc.get_threshold()[2])  # the full collections held while the table loads (their pauses hold
        observe(folds, event, now)  # every thread for as long as they walk the load's objects)

    monkeypatch.setattr(Folds, "observe", noted)
    before = gc.get_threshold()

    gaps: list[float] = []

    async def probe() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(0.01)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    probing = asyncio.create_task(probe())
    view = FleetView(fleet)
    following = asyncio.create_task(view.follow())
    try:
        await asyncio.wait_for(view.caught_up.wait(), 60)
        assert len(view.running_jobs.jobs(time.time())) == requests
        assert max(gaps) < 0.5, f"the loop was held {max(gaps):.3f} s"
        assert set(oldest) == {1 << 30} and gc.get_threshold() == before
    finally:
        for task in (following, probing):
            task.cancel()
        await asyncio.gather(following, probing, return_exceptions=True)
