"""Lifecycle events read back from `adapterd.events`, verified and parsed: for the CLI, the demo and the tests.

With the fleet's public keys in the settings (`event_verify_keys`, `event_verify_keys_file`, or the
host's own signing key), an event is taken only when a trusted key signed exactly its bytes
(schemas/signing.py); any other is ignored, never acted on, and counted by why, and the count is
said on stderr when the stream closes. Without a key, events are read unverified.

Each event is taken once, by its `event_id` (daemon/kafka/event_ids.py): a genuine event written again
verifies again, so the repeats are skipped and counted apart (`repeated`), said on stderr the same way.

Records read in bulk (the table's reader, daemon/table/reader.py) are taken by the same rules a batch at a time
(`verified_many`): each is verified and parsed by `checked` in the `verify` worker threads (daemon/executors.py),
beside the event loop and on every core, then counted and taken by its id in order on the loop. There a record that
is not an event of this version is ignored and counted (`not_an_event`) rather than raised.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from functools import partial
from types import TracebackType

from daemon.executors import run_chunks
from daemon.kafka.event_ids import EventIds
from daemon.kafka.records import Record
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys
from schemas import TERMINAL_TYPES, Event, parse_event
from schemas.signing import EventKeys, UnverifiedEvent


def checked(record: Record, keys: EventKeys | None) -> Event | UnverifiedEvent | ValueError:
    """The record's event when `keys` (if any) verify it and it parses, else why not: what a worker thread does with
    each record of a batch (it touches nothing shared, and the signature's check releases the interpreter)."""
    if keys is not None:
        try:
            keys.verify(record.value or b"", record.headers)
        except UnverifiedEvent as exc:
            return exc
    try:
        return parse_event(record.value or b"")
    except ValueError as exc:  # pydantic's ValidationError is one: not an event of this version
        return exc


def misplaced(record: Record, event: Event) -> bool:
    """A genuine event of another request than the record's key names, written again under this key by someone: a
    reader of its own request's partition never sees it, so no reader takes it."""
    return event.request_id is not None and record.key != event.request_id.encode()


class EventStream:
    """Events of every partition of the events topic, from its beginning or from its end as of entering.

    Entering from the end before a request is published guarantees that every event of that request
    is seen, and none of an earlier request that had the same id.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        from_end: bool = False,
        since: float | None = None,
        window_s: float | None = None,
        quiet: bool = False,
        reader: TopicReader | None = None,
    ) -> None:
        """`window_s`: the reader folds only the events of that past (`EventIds`); `quiet`: nothing said on stderr
        (the daemon logs the counts itself); `reader`: the events topic's reader, placed as its caller wants (some
        partitions, from given offsets), instead of one of every partition placed by `from_end` and `since`."""
        self.settings = settings
        self.reader = reader or TopicReader(settings, settings.events_topic, from_end=from_end, since=since)
        self.keys = event_keys(settings)
        self.quiet = quiet
        self.ignored: Counter[str] = Counter()  # events not taken, by why (UnverifiedEvent's reasons, `misplaced`)
        self.ids = EventIds(window_s)
        self.repeated: Counter[str] = (
            Counter()
        )  # genuine events not taken again: `repeated` (an id taken), `stale` (before the window)

    async def __aenter__(self) -> EventStream:
        await self.reader.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.reader.stop()
        if self.quiet:
            return
        if self.ignored:
            print(f"adapterd: {self.ignored_note()}", file=sys.stderr, flush=True)
        if self.repeated:
            print(f"adapterd: {self.repeated_note()}", file=sys.stderr, flush=True)

    def ignored_note(self) -> str:
        """How many events were ignored and why, in one line."""
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(self.ignored.items()))
        return (
            f"ignored {self.ignored.total()} event(s) in {self.settings.events_topic} without a valid signature "
            f"of a trusted key ({why})"
        )

    def repeated_note(self) -> str:
        """How many events were skipped as taken already (or older than the window), in one line."""
        why = ", ".join(f"{count} {reason}" for reason, count in sorted(self.repeated.items()))
        return (
            f"skipped {self.repeated.total()} event(s) in {self.settings.events_topic} read already or "
            f"older than what is folded ({why})"
        )

    def verified(self, record: Record, now: float | None = None) -> Event | None:
        """The record's event, or None (counted) when the reader has keys and none of them signed it, or when an event
        of its `event_id` was taken already (`now`: the time the window, if any, ends; else the clock's)."""
        event = self._signed(record)
        if event is None:
            return None
        refused = self.ids.refused(event, time.time() if now is None else now)
        if refused is not None:
            self.repeated[refused] += 1
            return None
        return event

    async def verified_many(self, records: Sequence[Record], now: float | None = None) -> list[Event | None]:
        """`verified` of each record, in order, the signatures checked and the events parsed in the `verify` threads.
        None too, counted, for a record that is not an event of this version (`not_an_event`) and for a genuine event
        under another key than its request's (`misplaced`: written again by someone; a reader of one key's partition
        would never see it), before its id is taken."""
        found = await run_chunks("verify", partial(checked, keys=self.keys), records)
        at = time.time() if now is None else now
        taken: list[Event | None] = []
        for record, result in zip(records, found, strict=True):
            event: Event | None = None
            if isinstance(result, UnverifiedEvent):
                self._unverified(result)
            elif isinstance(result, ValueError):
                self.ignored["not_an_event"] += 1
            elif misplaced(record, result):
                self.ignored["misplaced"] += 1
            elif (refused := self.ids.refused(result, at)) is not None:
                self.repeated[refused] += 1
            else:
                event = result
            taken.append(event)
        return taken

    def _signed(self, record: Record) -> Event | None:
        if self.keys is not None:
            try:
                self.keys.verify(record.value or b"", record.headers)
            except UnverifiedEvent as exc:
                self._unverified(exc)
                return None
        return parse_event(record.value or b"")

    def _unverified(self, exc: UnverifiedEvent) -> None:
        # Said at once too: a command following events may wait long for its end.
        if not self.ignored and not self.quiet:
            print(
                f"adapterd: ignoring events without a valid signature of a trusted key (first: {exc}); "
                "how many is said at the end",
                file=sys.stderr,
                flush=True,
            )
        self.ignored[exc.reason] += 1

    async def events(
        self, request_id: str | None = None, *, until_terminal: bool = True, follow: bool = True
    ) -> AsyncIterator[Event]:
        """The events, optionally of one request. With `until_terminal`, stop after that request's
        terminal event; without `follow`, stop once caught up with the end as of entering."""
        key = request_id.encode() if request_id is not None else None
        async for record in self.reader.records(follow=follow):
            if key is not None and record.key != key:
                continue
            event = self.verified(record)
            if event is None:
                continue
            if request_id is not None and event.request_id != request_id:
                self.ignored["misplaced"] += 1  # a genuine event of another request, written again under this key
                continue
            yield event
            if until_terminal and request_id is not None and event.type in TERMINAL_TYPES:
                return
