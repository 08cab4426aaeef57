"""Which events a reader has taken already, by `event_id`: a genuine event written again (a producer's
retry, a replay by anyone who can write the topic) is taken once.

A signature says who wrote an event's bytes, not how often they were written: the same signed bytes
verify every time. So every reader that folds events into decisions (the fleet's view, the CLI's
`jobs`, `get` and places) remembers the ids it took.

The memory is bounded by what the reader keeps. With a `window_s` (the fleet's view folds the events
of its last `USAGE_LOOKBACK_S`) it holds the ids of the events whose own time is within the window,
and an event older than the window is refused outright (`stale`): its id may have been forgotten, and
an old `accepted` taken again would open a stretch of slot-time hours long. Without a window (a CLI
command reading the topic once, keeping every event in memory anyway) it holds every id it took.
"""

from __future__ import annotations

import heapq
from typing import Literal

from schemas import Event

Refused = Literal["repeated", "stale"]


class EventIds:
    def __init__(self, window_s: float | None = None) -> None:
        self.window_s = window_s
        self._ids: set[str] = set()
        self._expiry: list[tuple[float, str]] = []  # (event time, id), oldest first: what the window forgets next

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, event_id: object) -> bool:
        return event_id in self._ids

    def refused(self, event: Event, now: float) -> Refused | None:
        """None, remembering its id, the first time an event is offered within the window; else why not."""
        if self.window_s is not None:
            start = now - self.window_s
            while self._expiry and self._expiry[0][0] < start:
                self._ids.discard(heapq.heappop(self._expiry)[1])
            at = event.time.timestamp()
            if at < start:
                return "stale"
        if event.event_id in self._ids:
            return "repeated"
        self._ids.add(event.event_id)
        if self.window_s is not None:
            heapq.heappush(self._expiry, (at, event.event_id))
        return None
