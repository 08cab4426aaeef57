"""Every request that waits for a slot, read from Kafka itself: for `adapterd jobs --state queued`,
`adapterd get` and the sweep of `adapterd cancel`.

A waiting request is in one of two places (docs/architecture.md, "The fleet's order", seen from outside):
- not yet read: a record of a queue topic at or past its queue group's committed offset. With
  priority classes, each class's topic (Settings.class_topics) in group `<group_id>.queue.<class>`;
  without, the requests topic in group `<group_id>` (there the record at the committed offset is the
  partition's running job, which its events set apart);
- read and waiting: a record of the claims topic past group `<group_id>`'s committed offset whose
  request has not been accepted, and any request whose latest event says it waits (`retrying`,
  `queued`, `preempted`) wherever its record is.
A request whose latest event is `accepted` has its slot and starts now; it is listed too (stage
`accepted`: the events' table calls it queued), and daemon/cli/places.py gives it no place.

What the events say of each request comes from the table of requests and the events past it
(daemon/table/reader.py `read_table`), not from every event: a request's latest state is its entry, and
what the fleet's order folds of the requests (their `accepted`, `queued` and `preempted`: class, team,
metadata, slots; their starts and ends: usage and durations) is each entry's latest event of each type
(`TableRead.recent`).

The offsets come from the admin client and the records from a reader of assigned partitions, so
nothing here joins a group: listing the queue never rebalances the daemons. The records are decoded
as a daemon decodes them (daemon/decoding.py: its credential scanner and size bound too); one that is
not a request, or that a daemon would refuse for a credential or its size, is listed as such.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from daemon.admission.gpu_kinds import GpuNeed
from daemon.cli.jobs import RequestSummary, fold
from daemon.decoding import decoded_now
from daemon.errors import TopicMissing
from daemon.kafka.admin.group_offsets import committed_offsets
from daemon.kafka.records import Record
from daemon.kafka.retry_state import PREEMPTIONS_HEADER
from daemon.kafka.topic_reader import TopicReader
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER, queue_group, team_of
from daemon.table.reader import TableRead, read_table
from schemas import Event, Rejection
from schemas.events import Accepted, Preempted, Queued


@dataclass(frozen=True)
class Queue:
    """One topic that holds waiting requests, the group that reads it, and what its records are."""

    group: str
    topic: str
    stage: str  # "unread" (a queue topic) or "claimed" (the claims topic: moved to a host with room)
    priority_class: str | None  # the class whose queue it is; None for the claims topic and without classes


@dataclass(frozen=True)
class SentCancel:
    """A cancel read from the control topic (daemon/cli/cancels_sent.py): when it was written, and why."""

    sent: datetime
    reason: str

    def said(self) -> str:
        return f"sent {self.sent:%Y-%m-%d %H:%M:%S}Z" + (f": {self.reason}" if self.reason else "")


@dataclass
class WaitingRequest:
    """One waiting request as the CLI reads it from Kafka: what it is, and where and how it waits (the fleet's
    order takes its own `daemon.fleet.policy.order.FleetRequest` of it: daemon/cli/places.py)."""

    request_id: str
    priority_class: str | None
    team: str
    arrived: datetime
    method: str | None
    model: str | None
    gpus: int
    metadata: dict[str, str]
    stage: str  # unread, claimed, accepted, retrying, queued, preempted, or undecodable (never ordered)
    where: str  # topic[partition]@offset, or "on <host>" where only its events say it waits
    detail: str = ""
    host: str | None = None  # the host of its latest event, if it has one
    at: tuple[str, int, int] | None = (
        None  # its record's topic, partition and offset; None where only its events say it waits
    )
    steps: int | None = None  # its training.max_steps, from its record: its ETA's length (None: the median job's)
    cancel: SentCancel | None = None  # a cancel sent and not yet honoured (daemon/cli/cancels_sent.py): placed nowhere
    after: list[str] = field(default_factory=list)  # its request's `after`, as its record says
    need: GpuNeed | None = None  # the GPUs' kind or memory it asks for (resources.gpu_kind...): the slots that serve it
    hosts: int = 1  # the hosts its GPUs span (resources.hosts): more than one, it takes none of the fleet's slots


@dataclass
class Backlog:
    """The waiting requests, and what was read to find them."""

    waiting: list[WaitingRequest]
    # Every request decoded from a record past a committed offset, the running ones too (their record
    # is not committed until they end): the sweep matches running requests by their record.
    records: dict[str, WaitingRequest]
    jobs: dict[str, RequestSummary]
    events: list[Event]  # what the fleet's folds take: every entry's latest event of each type, by time
    missing: list[str] = field(default_factory=list)  # queue topics that do not exist: nothing waits there


def queues(settings: Settings) -> list[Queue]:
    """The topics a waiting request can be in, highest class first, the claims topic last."""
    if not settings.priority_classes:
        return [Queue(settings.group_id, settings.requests_topic, "unread", None)]
    return [
        Queue(queue_group(settings.group_id, name), topic, "unread", name)
        for name, topic in settings.class_topics.items()
    ] + [Queue(settings.group_id, settings.claims_topic, "claimed", None)]


async def read_backlog(settings: Settings, table: TableRead | None = None) -> Backlog:
    """Read the queues past their groups' committed offsets and the table of requests (unless it is given, read
    already), and find who waits."""
    found = await committed_offsets(settings, [(queue.group, queue.topic) for queue in queues(settings)])
    read: list[tuple[Queue, Record]] = []
    missing = []
    for queue in queues(settings):
        # read_committed: a claim or a preempted request put back in an aborted transaction never happened.
        try:
            async with TopicReader(
                settings, queue.topic, start_at=found[(queue.group, queue.topic)], read_committed=True
            ) as reader:
                read += [(queue, record) async for record in reader.records(follow=False)]
        except TopicMissing:
            missing.append(queue.topic)
    table = await read_table(settings) if table is None else table
    backlog = combine(read, table.recent(), settings, table.entries)
    backlog.missing = missing
    return backlog


def combine(
    read: list[tuple[Queue, Record]],
    events: list[Event],
    settings: Settings,
    jobs: dict[str, RequestSummary] | None = None,
) -> Backlog:
    """The waiting requests, from the records past the committed offsets (in the order read), the requests' states
    (`jobs`; else the fold of `events`) and the `events` that name their class, team and metadata."""
    jobs = fold(events) if jobs is None else jobs
    records: dict[str, WaitingRequest] = {}
    waiting: dict[str, WaitingRequest] = {}
    undecodable: list[WaitingRequest] = []
    for queue, record in read:
        each = from_record(queue, record, settings)
        if each.stage == "undecodable":
            undecodable.append(each)
            continue
        records[each.request_id] = each  # a later copy (a retry, a request put back) is where it waits now
        job = jobs.get(each.request_id)
        arrived_after_end = (
            job is not None
            and job.state in ("succeeded", "failed", "cancelled", "rejected")
            and each.arrived > job.last
        )
        if job is None or arrived_after_end:
            waiting[each.request_id] = each  # no host has said a word of it (since it last ended: sent again)
        elif job.state in ("queued", "held"):
            # In the claims topic it is claimed, whatever it went through before (queued,
            # preempted) until it is accepted.
            each.stage = job.latest if queue.stage != "claimed" or job.latest == "accepted" else "claimed"
            each.host = job.host
            each.arrived = min(each.arrived, job.since)
            each.detail = each.detail or _said(job)
            waiting[each.request_id] = each
        else:
            waiting.pop(each.request_id, None)  # running, or ended and about to be committed
    named = named_in_events(events)
    for request_id, job in jobs.items():
        if job.state in ("queued", "held") and request_id not in waiting:
            priority_class, team, metadata = named.get(request_id, (None, None, {}))
            waiting[request_id] = WaitingRequest(
                request_id,
                priority_class or settings.default_class,
                team_of(team),
                job.since,
                job.method,
                None,
                1,
                metadata,
                job.latest,
                f"on {job.host}",
                _said(job),
                job.host,
            )
    return Backlog(list(waiting.values()) + undecodable, records, jobs, events)


def from_record(queue: Queue, record: Record, settings: Settings) -> WaitingRequest:
    """What a record of a queue says of its request; an undecodable one is listed with why, never raised."""
    where = f"{record.topic}[{record.partition}]@{record.offset}"
    arrived = datetime.fromtimestamp(max(record.timestamp, 0) / 1000, UTC)
    try:
        decoded = decoded_now(record, settings.max_message_bytes)
    except Exception as exc:  # decoding is total; this guards the listing against a bug in it all the same
        decoded = Rejection("internal", [], None, type(exc).__name__)
    if isinstance(decoded, Rejection):
        why = (
            f"{decoded.reason}: {decoded.errors[0].path or '(message)'}: {decoded.errors[0].message[:100]}"
            if decoded.errors
            else decoded.reason
        )
        return WaitingRequest(
            decoded.request_id or "-",
            queue.priority_class,
            "-",
            arrived,
            None,
            None,
            1,
            {},
            "undecodable",
            where,
            f"not a request ({why}); the daemon that reads it rejects it",
        )
    preempted = _header(record, PREEMPTIONS_HEADER)  # as the record says: only a host with the retry key can verify it
    claimed_as = _header(record, CLASS_HEADER) if queue.stage == "claimed" else None
    return WaitingRequest(
        decoded.request_id,
        claimed_as or decoded.priority_class or queue.priority_class or settings.default_class,
        team_of(decoded.team),
        arrived,
        decoded.method,
        decoded.model.id,
        decoded.resources.gpus,
        dict(decoded.metadata),
        queue.stage,
        where,
        "; ".join(
            [
                *([f"preempted {preempted}x, resumes from its checkpoint"] if preempted else []),
                *([f"after {', '.join(decoded.after)}"] if decoded.after else []),  # its request's own `after`
            ]
        ),
        at=(record.topic, record.partition, record.offset),
        steps=decoded.training.max_steps,
        after=list(decoded.after),
        need=GpuNeed.of(decoded.resources),
        hosts=decoded.resources.hosts,
    )


def _said(job: RequestSummary) -> str:
    """What a waiting request's latest event adds: why it waits again (a retry, a preemption, its `after`). A `queued`
    event's place is left out: it is the place when that host said it; the listing's place is now's."""
    return job.detail if job.latest in ("retrying", "preempted", "waiting") else ""


def _header(record: Record, name: str) -> str | None:
    for key, value in record.headers:
        if key == name and value is not None:
            return value.decode("utf-8", "replace")
    return None


def named_in_events(events: list[Event]) -> dict[str, tuple[str | None, str | None, dict[str, str]]]:
    """Each request's class, team and metadata as its latest event that names them says (accepted,
    queued, preempted): for a request that waits where only its events say so."""
    named: dict[str, tuple[str | None, str | None, dict[str, str]]] = {}
    for event in events:
        if event.request_id is not None and isinstance(event, Accepted | Queued | Preempted):
            previous = named.get(event.request_id, (None, None, {}))
            named[event.request_id] = (
                event.priority_class or previous[0],
                (event.team if not isinstance(event, Preempted) else None) or previous[1],
                event.metadata,
            )
    return named
