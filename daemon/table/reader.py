"""The one reader of the table of requests: each request's state now, as the table and the events past it say it,
for `adapterd jobs`, `get` and `cancel` and for the fleet's view.

`read_table` reads every partition of the state topic from its beginning to its end as of the read, each record
taken by `read_entry` (verified with the fleet's event keys, as events are), in batches in the `verify` worker
threads (daemon/executors.py: Ed25519's verify releases the interpreter, so they run beside the event loop and on
every core). In a partition a key's later record replaces its earlier one and a tombstone removes it, as compaction
will; a key found in two partitions (the events topic given more partitions since: a request's later events, and its
entry with them, move to a partition of a higher number) keeps the entry whose latest event is placed highest, by
(partition, offset) of the events topic. A record that is not a genuine entry is refused and counted by why, never
taken: the key's genuine state is then its earlier genuine entry, or what the events say.

The table is complete up to the keepers' committed offsets on the events topic (`keeper_group`,
the table's keeper); the events past them (the tail) are read to the topic's end as of the read, verified by
`EventStream`'s own rules in batches (`EventStream.verified_many`: the fleet's keys, each event taken once by its id,
a genuine event under another request's key refused as `misplaced`), and folded on top with `folded`, which skips an
event the entry holds already (its id, or its offset). So what is read is as current as the events topic, whether
the keepers are current, lag, or never ran (no offset committed: the tail is the whole events topic, and the result
is the fold of every event, as `adapterd jobs` read it before the table; no state topic at all, or a state partition
never written, as a topic made again is: the same, for those partitions). What it
reports beside the entries: the refused entries and ignored events by reason, where the tail began and where it was
read to in each partition (a follower of the events goes on from `events_to`). With `tail=False` it reads the table
alone and says where its tail begins (`events_from`: the keepers' committed offsets), for a reader that follows the
events itself from there (the fleet's view).

`read_request` reads one request (`adapterd get`, `adapterd cancel`): its key's partition of the state topic (the
partition its events go to, `partition_of`: aiokafka's default partitioner, murmur2 of the key over the events
topic's partitions, and an entry is written to the partition number its event came from), keeping that key's
latest record; then its events in the same-numbered partition of the events topic, the records of its key alone
verified, from its entry's first event's time less a minute (the hosts' clocks differ; Kafka finds the offset by
time) or, with no entry, from that partition's beginning, to the end, folded on top. It keeps those events in order
(`events`: the request's history since its entry's start) and reads nothing of any other partition, but in one
case: where its partition holds nothing of it (no entry, no event) and the events topic has other partitions, the
topic may have been given partitions since its latest event (its key hashed elsewhere then), so the other state
partitions' records of its key are read (that key's alone verified), and its events where its entry says its latest
one is. A request never seen costs that too.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial

from aiokafka.partitioner import DefaultPartitioner

from daemon.errors import TopicMissing
from daemon.executors import run_chunks
from daemon.kafka.admin.group_offsets import committed_offsets
from daemon.kafka.admin.topics import partition_numbers
from daemon.kafka.event_reader import EventStream
from daemon.kafka.records import Record
from daemon.kafka.topic_reader import TopicReader
from daemon.ops.heap import full_collections_held
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys
from daemon.table.codec import (
    Head,
    Refused,
    Seal,
    Tombstone,
    is_seal,
    parsed,
    read_entry,
    read_seal,
    sealed,
    unverified,
)
from daemon.table.entry import EntryHead, TableEntry, folded
from daemon.table.topic import keeper_group
from schemas import Event
from schemas.signing import EventKeys

# Records verified together: a few calls into the worker threads for each, and what is then done on the loop for them
# (the fold, ~20 µs an event) stays near 20 ms a batch, for a daemon reading the table beside its work.
BATCH = 1024
CLOCKS_S = 60.0  # how far before a request's first event its events are read from: the hosts' clocks differ
LOADING_S, LOADING_TRIES = 0.5, 20  # how often, and how many times, the keepers' offsets are asked while none is read


@dataclass
class TableRead:
    """What was read: the entries by request id, what was not taken and why, and how far each topic was read."""

    entries: dict[str, TableEntry] = field(default_factory=dict)
    # With `heads` (`adapterd jobs`): the entries the tail did not change, parsed without their events, and the record
    # of each, parsed whole if an event of the tail comes for it.
    heads: dict[str, EntryHead] = field(default_factory=dict)
    unparsed: dict[str, Record] = field(default_factory=dict)
    refused: Counter[str] = field(default_factory=Counter)  # state topic records not taken, by `Refused.reason`
    ignored: Counter[str] = field(default_factory=Counter)  # events of the tail not taken (EventStream's reasons)
    repeated: Counter[str] = field(default_factory=Counter)  # genuine events of the tail taken already
    state_to: dict[int, int] = field(default_factory=dict)  # state partition → its end as of the read, read to there
    events_from: dict[int, int] = field(default_factory=dict)  # events partition → where the tail began
    events_to: dict[int, int] = field(default_factory=dict)  # events partition → its end as of the read, read to there
    events: list[Event] = field(default_factory=list)  # `read_request`: the request's events read, in order
    skipped: dict[int, tuple[int, int]] = field(default_factory=dict)  # `read_request`: offsets stepped over (`_gap`)
    table: bool = True  # False when the state topic does not exist: everything came from the events
    notes: list[str] = field(default_factory=list)  # what was not taken, one line each, for stderr

    def listed(self) -> list[EntryHead]:
        """Every request read, whole or its head."""
        return [*self.heads.values(), *self.entries.values()]

    def whole(self) -> Iterator[TableEntry]:
        """Every entry whole, those read as heads parsed one at a time as they are taken (their records were verified):
        a reader that folds them where it iterates (the fleet's view, in a worker thread) never holds them all, and
        what it does not keep is freed there, not on the loop."""
        yield from self.entries.values()
        for record in self.unparsed.values():
            found = read_entry(record, None)
            if isinstance(found, TableEntry):
                yield found

    def recent(self) -> list[Event]:
        """Every entry's latest event of each type, by their time: what the fleet's folds (daemon/fleet/policy/usage.py,
        running.py) take of the requests, without reading every event of them."""
        return recent_events(self.entries.values())


def recent_events(entries: Iterable[TableEntry]) -> list[Event]:
    """The entries' `recent` events, all of them, in the order of their time (as numbers: an event's time may come with
    a time zone or without one, and the two do not compare as datetimes)."""
    return sorted((event for entry in entries for event in entry.recent), key=lambda event: event.time.timestamp())


def key_partition(request_id: str, partitions: Sequence[int]) -> int:
    """The partition the producer's default partitioner gives a request's key among `partitions`
    (daemon/kafka/publisher.py publishes every event keyed by its request id with it)."""
    numbers = sorted(partitions)
    return int(DefaultPartitioner()(request_id.encode(), numbers, numbers))


async def partition_of(settings: Settings, request_id: str) -> int:
    """The events topic's partition of a request's events, and so of its entry in the state topic."""
    return key_partition(request_id, list(await partition_numbers(settings, settings.events_topic)))


async def read_table(settings: Settings, *, tail: bool = True, heads: bool = False) -> TableRead:
    """Every request's state: the table, then the events past the keepers' committed offsets folded on top. Without
    `tail`, the table alone, and `events_from` says where the events past it begin (a follower of the events, the
    fleet's view, folds them itself from there). With `heads`, an entry no event of the tail changes is read as its
    head, without its events (`TableRead.heads`: what `adapterd jobs` lists)."""
    keys = event_keys(settings)
    read = TableRead()
    topic = settings.events_topic
    # The offsets before the table: a keeper commits only once its entries are written, so the table read after holds
    # every event before them (and perhaps some past them, which the fold then skips). Read the other way round, a
    # keeper writing and committing in between would leave its events in neither.
    committed = await _keepers_committed(settings)
    try:
        with full_collections_held():  # 22,605 entries: each full collection while they load walks them all
            await _read_entries(settings, keys, read, None, None, heads=heads)
    except TopicMissing:
        read.table, committed = False, {}  # no table yet (`adapterd topics` not run since): every event is read
    # A state partition never written (made again empty, or the table's topic given more partitions than it had) holds
    # nothing of what its keepers committed past: its events are read from their beginning.
    committed = {partition: offset for partition, offset in committed.items() if read.state_to.get(partition, 0) > 0}
    _say_refused(settings, read)
    if not tail:
        read.events_from = committed  # a partition left out: from its beginning
        return read
    await _read_tail(settings, read, TopicReader(settings, topic, start_at=committed), None)
    return read


async def _keepers_committed(settings: Settings) -> dict[int, int]:
    """The keepers' committed offsets on the events topic. A broker just started answers a group's offsets with none
    while its coordinator loads them (aiokafka reads no error), and `adapterd jobs` then folded every event of the
    topic (minutes, on a week's): where none is committed yet the state topic holds entries, which a keeper writes only
    before its commits, they are asked again, every LOADING_S for LOADING_TRIES."""
    group, topic = keeper_group(settings.group_id), settings.events_topic
    for _ in range(LOADING_TRIES):
        committed = (await committed_offsets(settings, [(group, topic)]))[(group, topic)]
        if committed or not await _state_written(settings):
            return committed
        await asyncio.sleep(LOADING_S)
    return committed


async def _state_written(settings: Settings) -> bool:
    """Whether any partition of the state topic holds a record."""
    try:
        async with TopicReader(settings, settings.state_topic, start_at={}) as reader:
            return any(end > 0 for end in reader.ends.values())
    except TopicMissing:
        return False


async def read_request(settings: Settings, request_id: str) -> TableRead:
    """One request's state and its events: one partition of the state topic and one of the events topic (where the
    events topic was given partitions since the request's latest event, and its partition now holds nothing of it:
    the other state partitions' records of its key, then its events where its entry says they are)."""
    keys = event_keys(settings)
    read = TableRead()
    numbers = sorted(await partition_numbers(settings, settings.events_topic))
    partition = key_partition(request_id, numbers)
    try:
        await _read_entries(settings, keys, read, [partition], request_id)
    except TopicMissing:
        read.table = False
    entry = read.entries.get(request_id)
    gap = await _gap(settings, read, entry, partition) if read.table else None
    await _read_tail(settings, read, _request_reader(settings, entry, partition), request_id, gap)
    if entry is None and not read.events and read.table and len(numbers) > 1:
        await _read_entries(settings, keys, read, [number for number in numbers if number != partition], request_id)
        entry = read.entries.get(request_id)
        if entry is not None and 0 <= entry.partition != partition:
            await _read_tail(settings, read, _request_reader(settings, entry, entry.partition), request_id)
    _say_refused(settings, read)
    return read


async def _gap(settings: Settings, read: TableRead, entry: TableEntry | None, partition: int) -> tuple[int, int] | None:
    """The offsets of the request's events partition past its entry's latest event and before the keepers' committed
    offset, which hold none of its events (a keeper commits only once the entries of the events before are written,
    and the entry read is the latest written): `adapterd get` of a request that ended days ago read every event of its
    partition since. None where that cannot be said: no entry, one taken from before a refused record, one of another
    partition."""
    if entry is None or entry.partition != partition or entry.offset < 0 or read.refused:
        return None
    group, topic = keeper_group(settings.group_id), settings.events_topic
    committed = (await committed_offsets(settings, [(group, topic)]))[(group, topic)].get(partition, 0)
    return (entry.offset + 1, committed) if committed > entry.offset + 1 else None


def _request_reader(settings: Settings, entry: TableEntry | None, partition: int) -> TopicReader:
    """A reader of one partition of the events topic from a minute before the entry's first event, or, with no
    entry, from its beginning."""
    since = None if entry is None else entry.since.timestamp() - CLOCKS_S
    return TopicReader(
        settings, settings.events_topic, since=since, start_at=None if since is not None else {}, partitions=[partition]
    )


async def _read_entries(
    settings: Settings,
    keys: EventKeys | None,
    read: TableRead,
    partitions: list[int] | None,
    request_id: str | None,
    *,
    heads: bool = False,
) -> None:
    """The state topic's `partitions` (None: all) into `read.entries` (with `request_id`: that key's records alone).

    A state partition not yet compacted holds many records of a key (its keeper writes an entry at each change): each
    key's latest record is kept as it is read, and only those are verified and parsed, a batch at a time in worker
    threads. A key whose latest record is refused (forged, malformed) is read again, all its records in order, for
    its latest record that is taken; a key whose latest is a tombstone is gone."""
    key = None if request_id is None else request_id.encode()
    model: type[EntryHead] = Head if heads else TableEntry
    latest: dict[tuple[int, bytes | None], Record] = {}  # (partition, key) → its latest record
    # Each record parsed and hashed in the worker threads as its poll comes (the client fetches the next meanwhile),
    # verified once the seals are read: a record's key may come again later in its partition, and its seal after it.
    taken: dict[tuple[int, bytes | None], tuple[EntryHead | Tombstone | Refused, bytes]] = {}
    async with TopicReader(settings, settings.state_topic, start_at={}, partitions=partitions) as reader:
        read.state_to.update({tp.partition: end for tp, end in reader.ends.items()})
        async for batch in _batches(reader.records(follow=False), key):
            entries = []
            for record in batch:
                latest[(record.partition, record.key)] = record
                if not is_seal(record):
                    entries.append(record)
            results = await run_chunks("parse", partial(parsed, model=model), entries)
            for record, result in zip(entries, results, strict=True):
                taken[(record.partition, record.key)] = result
    seals = [record for record in latest.values() if is_seal(record)]
    digests = await _sealed(keys, seals, read) if keys is not None and seals else {}
    to_verify = [
        latest[where]
        for where, (result, value_digest) in taken.items()
        if keys is not None
        and not isinstance(result, Tombstone)
        and value_digest  # hashed: not one larger than a record may be (refused as it is)
        and value_digest != digests.get(where[0], {}).get((where[1] or b"").decode("utf-8", errors="replace"))
    ]
    if to_verify and keys is not None:
        whys = await run_chunks("verify", partial(unverified, keys=keys), to_verify)
        for record, why in zip(to_verify, whys, strict=True):
            if why is not None:
                taken[(record.partition, record.key)] = (why, b"")
    found: dict[int, dict[str, EntryHead]] = {}
    refused: set[tuple[int, bytes | None]] = set()
    for (partition, record_key), (outcome, _) in taken.items():
        if isinstance(outcome, Refused):
            read.refused[outcome.reason] += 1
            refused.add((partition, record_key))
        elif isinstance(outcome, EntryHead):
            found.setdefault(partition, {})[outcome.request_id] = outcome
    if refused:
        await _read_past_refused(settings, keys, read, refused, found)
    for partition, mine in found.items():
        for each, entry in mine.items():
            kept = read.entries.get(each) or read.heads.get(each)
            if kept is None or (entry.partition, entry.offset) > (kept.partition, kept.offset):
                read.entries.pop(each, None)
                read.heads.pop(each, None)
                read.unparsed.pop(each, None)
                if isinstance(entry, TableEntry):
                    read.entries[each] = entry
                else:
                    read.heads[each], read.unparsed[each] = entry, latest[(partition, each.encode())]


async def _sealed(keys: EventKeys, seals: list[Record], read: TableRead) -> dict[int, dict[str, bytes]]:
    """The partitions' seals verified (`codec.sealed`): partition → request id → its entry's digest; a seal refused is
    counted as an entry is."""
    taken = await run_chunks("verify", partial(read_seal, keys=keys), seals)
    for result in taken:
        if isinstance(result, Refused):
            read.refused[result.reason] += 1
    return sealed(result for result in taken if isinstance(result, Seal))


async def _read_past_refused(
    settings: Settings,
    keys: EventKeys | None,
    read: TableRead,
    refused: set[tuple[int, bytes | None]],
    found: dict[int, dict[str, EntryHead]],
) -> None:
    """The keys whose latest record was refused, read again in their partitions: each one's latest record taken (an
    entry, or a tombstone that removes it), the records after it being refused (said already)."""
    partitions = sorted({partition for partition, _ in refused})
    async with TopicReader(settings, settings.state_topic, start_at={}, partitions=partitions) as reader:
        async for batch in _batches(reader.records(follow=False), None):
            batch = [record for record in batch if (record.partition, record.key) in refused]
            for record, result in zip(
                batch, await run_chunks("verify", partial(read_entry, keys=keys), batch), strict=True
            ):
                if isinstance(result, Tombstone):
                    found.get(record.partition, {}).pop(result.request_id, None)
                elif isinstance(result, TableEntry):
                    found.setdefault(record.partition, {})[result.request_id] = result


def _say_refused(settings: Settings, read: TableRead) -> None:
    if read.refused:
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(read.refused.items()))
        read.notes.append(
            f"ignored {read.refused.total()} entry(ies) in {settings.state_topic} without a valid signature of a "
            f"trusted key, or not an entry of its key ({why})"
        )


async def _read_tail(
    settings: Settings, read: TableRead, reader: TopicReader, request_id: str | None, gap: tuple[int, int] | None = None
) -> None:
    """The events `reader` is placed at, to its ends, folded onto `read.entries` (with `request_id`: that key's
    records alone, and kept in `read.events`; with `gap`, offsets of its one partition known to hold none of them,
    stepped over)."""
    key = None if request_id is None else request_id.encode()
    async with EventStream(settings, quiet=True, reader=reader) as stream:
        read.events_from.update({tp.partition: position for tp, position in reader.next_offset.items()})
        read.events_to.update({tp.partition: end for tp, end in reader.ends.items()})
        await _fold_tail(read, stream, reader, key, None if gap is None else gap[0])
        if gap is not None:  # read up to its start (it is before the ends: the keepers committed past it)
            read.skipped.update({tp.partition: gap for tp in reader.ends})
            await reader.again({tp.partition: gap[1] for tp in reader.ends})
            read.events_to.update({tp.partition: end for tp, end in reader.ends.items()})
            await _fold_tail(read, stream, reader, key, None)
        read.ignored.update(stream.ignored)
        read.repeated.update(stream.repeated)
        read.notes += [stream.ignored_note()] if stream.ignored else []
        read.notes += [stream.repeated_note()] if stream.repeated else []


async def _fold_tail(
    read: TableRead, stream: EventStream, reader: TopicReader, key: bytes | None, until: int | None
) -> None:
    """The events read on to the reader's ends (or up to offset `until`), folded on."""
    async for batch in _batches(reader.records(follow=False), key, until):
        for record, event in zip(batch, await stream.verified_many(batch), strict=True):
            if event is None or event.request_id is None:
                continue
            entry = folded(_whole(read, event.request_id), event, record.partition, record.offset)
            if entry is not None:
                read.entries[entry.request_id] = entry
            if key is not None:
                read.events.append(event)


def _whole(read: TableRead, request_id: str) -> TableEntry | None:
    """A request's entry as the fold takes it: an entry read as its head parsed whole (its record verified already)."""
    if request_id in read.heads:
        del read.heads[request_id]
        found = read_entry(read.unparsed.pop(request_id), None)
        if isinstance(found, TableEntry):
            read.entries[request_id] = found
    return read.entries.get(request_id)


async def _batches(
    records: AsyncIterator[Record], key: bytes | None, until: int | None = None
) -> AsyncIterator[list[Record]]:
    """The records in batches of up to BATCH (with `key`: that key's alone; with `until`, those before that offset of
    a reader of one partition)."""
    batch: list[Record] = []
    async for record in records:
        if until is not None and record.offset >= until:
            break
        if key is not None and record.key != key:
            continue
        batch.append(record)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch
