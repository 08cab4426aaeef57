"""The cancels sent to waiting requests and not yet honoured, as `adapterd jobs --state queued` and
`adapterd get` show them: such a request leaves the queue's listing at once, marked cancel pending.

A cancel of a request that has not started is honoured only when a host reaches it (daemon/jobs/cancels.py;
with classes, the host whose window holds it ends it at its next turn, daemon/fleet/dispatcher.py
`_withdraw`), which behind a full fleet can be long after the cancel: until its `cancelled` event, the
queue's listing would show it waiting, placed, with an ETA, and counted ahead of the others.

A hold (or pause) is the same: a daemon passes a held request by only once it reaches it, and says `held` then, so
until a host has, the listing would place it. A request whose latest hold or pause in the window has no release or
resume after it is listed held (stage `held`), placed nowhere, as one whose `held` event was read.

The control topic is read as a daemon reads it at its start (daemon/kafka/control.py): every partition,
no consumer group, the messages of the last `control_lookback_s`. A daemon remembers a cancel by request
id, whatever was written before or after it, and skips that request when it reaches it: so is each
waiting request with such a cancel marked here. A cancel of a request that ended is not waiting and
changes nothing; a message that is not one of the control messages is passed over, as a daemon logs it and passes it
over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import ValidationError

from daemon.cli.waiting import SentCancel, WaitingRequest
from daemon.errors import TopicMissing
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas import Cancel, Hold, Pause, Release, Resume
from schemas.control import CONTROL_ADAPTER

# The stages at which a request no host has yet told `held` waits: read in a queue, or claimed by a host with room.
NOT_YET_REACHED = ("unread", "claimed", "queued")


@dataclass
class SentControl:
    """What the control topic's last `control_lookback_s` says of waiting requests: each cancel (its latest, where
    several were sent), and each hold or pause with no release or resume after it (its reason)."""

    cancels: dict[str, SentCancel] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)


async def sent_control(settings: Settings, now: datetime) -> SentControl:
    """The cancels and holds sent in the control topic's last `control_lookback_s`, in their order; none when the topic
    is missing."""
    found = SentControl()
    try:
        async with TopicReader(
            settings, settings.control_topic, since=now.timestamp() - settings.control_lookback_s
        ) as reader:
            async for record in reader.records(follow=False):
                try:
                    message = CONTROL_ADAPTER.validate_json(record.value or b"")
                except ValidationError:
                    continue
                if isinstance(message, Cancel):
                    found.cancels[message.request_id] = SentCancel(
                        datetime.fromtimestamp(max(record.timestamp, 0) / 1000, UTC), message.reason or "cancelled"
                    )
                elif isinstance(message, Hold | Pause):
                    found.held[message.request_id] = message.reason or message.type
                elif isinstance(message, Release | Resume):
                    found.held.pop(message.request_id, None)
    except TopicMissing:
        return SentControl()
    return found


def mark_sent(waiting: list[WaitingRequest], sent: SentControl) -> None:
    """Mark each waiting request with its pending cancel (`WaitingRequest.cancel`), and list one held that no host has
    yet reached as held (its stage `held`: placed nowhere); a record that is not a request has none to honour."""
    for each in waiting:
        if each.stage == "undecodable":
            continue
        each.cancel = sent.cancels.get(each.request_id)
        if each.cancel is None and each.request_id in sent.held and each.stage in NOT_YET_REACHED:
            each.stage, each.detail = "held", f"hold sent: {sent.held[each.request_id]}"
