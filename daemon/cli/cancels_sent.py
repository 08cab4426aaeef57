"""The cancels sent to waiting requests and not yet honoured, as `adapterd jobs --state queued` and
`adapterd get` show them: such a request leaves the queue's listing at once, marked cancel pending.

A cancel of a request that has not started is honoured only when a host reaches it (daemon/jobs/cancels.py;
with classes, the host whose window holds it ends it at its next turn, daemon/fleet/dispatcher.py
`_withdraw`), which behind a full fleet can be long after the cancel: until its `cancelled` event, the
queue's listing would show it waiting, placed, with an ETA, and counted ahead of the others.

The control topic is read as a daemon reads it at its start (daemon/kafka/control.py): every partition,
no consumer group, the messages of the last `control_lookback_s`. A daemon remembers a cancel by request
id, whatever was written before or after it, and skips that request when it reaches it: so is each
waiting request with such a cancel marked here. A cancel of a request that ended is not waiting and
changes nothing; one that is not a cancel is passed over, as a daemon logs it and passes it over.
"""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import ValidationError

from daemon.cli.waiting import SentCancel, WaitingRequest
from daemon.errors import TopicMissing
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from schemas import Cancel


async def sent_cancels(settings: Settings, now: datetime) -> dict[str, SentCancel]:
    """Each request id with a cancel in the control topic's last `control_lookback_s` (its latest, where several were
    sent); none when the topic is missing."""
    found: dict[str, SentCancel] = {}
    try:
        async with TopicReader(
            settings, settings.control_topic, since=now.timestamp() - settings.control_lookback_s
        ) as reader:
            async for record in reader.records(follow=False):
                try:
                    cancel = Cancel.model_validate_json(record.value or b"")
                except ValidationError:
                    continue
                found[cancel.request_id] = SentCancel(
                    datetime.fromtimestamp(max(record.timestamp, 0) / 1000, UTC), cancel.reason or "cancelled"
                )
    except TopicMissing:
        return {}
    return found


def mark_cancelled(waiting: list[WaitingRequest], cancels: dict[str, SentCancel]) -> None:
    """Mark each waiting request with its pending cancel (`WaitingRequest.cancel`); a record that is not a request has
    none to honour."""
    for each in waiting:
        if each.stage != "undecodable":
            each.cancel = cancels.get(each.request_id)
