"""Lifecycle events read back from `adapterd.events`, verified and parsed: for the CLI, the demo and the tests.

With the fleet's public keys in the settings (`event_verify_keys`, `event_verify_keys_file`, or the
host's own signing key), an event is taken only when a trusted key signed exactly its bytes
(schemas/signing.py); any other is ignored, never acted on, and counted by why, and the count is
said on stderr when the stream closes. Without a key, events are read unverified.

Each event is taken once, by its `event_id` (daemon/kafka/event_ids.py): a genuine event written again
verifies again, so the repeats are skipped and counted apart (`repeated`), said on stderr the same way.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from types import TracebackType

from daemon.kafka.event_ids import EventIds
from daemon.kafka.records import Record
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys
from schemas import TERMINAL_TYPES, Event, parse_event
from schemas.signing import UnverifiedEvent


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
    ) -> None:
        """`window_s`: the reader folds only the events of that past (`EventIds`); `quiet`: nothing said on stderr
        (the daemon logs the counts itself)."""
        self.settings = settings
        self.reader = TopicReader(settings, settings.events_topic, from_end=from_end, since=since)
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

    def _signed(self, record: Record) -> Event | None:
        if self.keys is not None:
            try:
                self.keys.verify(record.value or b"", record.headers)
            except UnverifiedEvent as exc:
                if (
                    not self.ignored and not self.quiet
                ):  # said at once too: a command following events may wait long for its end
                    print(
                        f"adapterd: ignoring events without a valid signature of a trusted key (first: {exc}); "
                        "how many is said at the end",
                        file=sys.stderr,
                        flush=True,
                    )
                self.ignored[exc.reason] += 1
                return None
        return parse_event(record.value or b"")

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
