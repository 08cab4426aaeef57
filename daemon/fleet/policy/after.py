"""What the fleet's view says of the requests a waiting request's `after` names (issue 63), so the dispatcher does not
claim a request that may not start yet: one of them queued, running or waiting itself, by the latest event of each
request the view has folded (`Latest`).

The view folds the events of its window only (daemon/fleet/view.py, four hours): a prerequisite it has no event of
(older, or not yet read by any host) is not held against the request, which is claimed, and the scheduler reads that
prerequisite by its key in the table of requests, waits for it or ends the request (daemon/jobs/prerequisites.py). So
the view only spares a claim, and is never the word on whether a request starts."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from schemas import Event

ENDED_TYPES = frozenset({"succeeded", "failed", "cancelled", "rejected"})
MOST = 200_000  # requests remembered, the least recently changed forgotten first: the view's memory stays bounded


class Latest:
    """Each request's latest event type, as folded."""

    def __init__(self, most: int = MOST) -> None:
        self.types: OrderedDict[str, str] = OrderedDict()
        self.most = most

    def observe(self, event: Event) -> None:
        if event.request_id is None:
            return
        self.types[event.request_id] = event.type
        self.types.move_to_end(event.request_id)
        if len(self.types) > self.most:
            self.types.popitem(last=False)

    def pending(self, after: Sequence[str]) -> list[str]:
        """The ids of `after` the view knows to have not ended yet: while any is, the request may not start."""
        return [each for each in after if self.types.get(each, "succeeded") not in ENDED_TYPES]
