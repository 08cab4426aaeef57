"""benchmarks/fleet_history.py, the fleet_scale benchmark's synthetic history, on a few GPUs (no broker): each
host's events in time order (the merge that writes them needs it), signed as the daemon signs them, every running job
where a restarted host's view reads it, and every waiting request a request the fleet decodes, the large ones just
under what a request may weigh. The benchmark itself runs minutes (a minute and more with `--small`): not a test."""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.fleet_history import (
    JOB_GAP_S,
    RECENT_S,
    Built,
    Fleet,
    _message,
    _records,
    _sign,
    _Slot,
    backlog,
    request_body,
    told,
)
from daemon.kafka.copies import COPY_HEADROOM_BYTES
from daemon.kafka.publisher import Publisher
from daemon.settings import Settings
from schemas import RequestBase, decode_request
from schemas.events import TERMINAL_TYPES, EventBase
from schemas.signing import EventKeys, EventSigner, new_key_pair, public_key_text, read_private_key
from testbed.memory_kafka import FakeProducer

FLEET = Fleet(gpus=4, days=1.0, progress_s=600.0, waiting=40, large=2, teams=2)


def slots(now: float) -> list[list[tuple[float, EventBase]]]:
    built = Built()
    return [list(_Slot(FLEET, gpu, now - FLEET.days * 86400, now, built).events()) for gpu in range(FLEET.gpus)]


def test_each_slots_events_are_in_time_order_and_its_running_job_started_within_the_views_window() -> None:
    now = time.time()
    for events in slots(now):
        times = [t for t, _ in events]
        assert times == sorted(times)
        ended = {e.request_id for _, e in events if e.type in TERMINAL_TYPES or e.type == "preempted"}
        running = [(t, e) for t, e in events if e.type == "accepted" and e.request_id not in ended]
        assert len(running) == 1
        assert now - running[0][0] <= RECENT_S + 1800 + JOB_GAP_S


def test_the_backlogs_queued_events_are_in_time_order() -> None:
    now = time.time()
    times = [t for t, _ in told(FLEET, backlog(FLEET, now), now)]
    assert times == sorted(times) and len(times) >= FLEET.waiting


def test_events_are_signed_as_the_publisher_signs_them(tmp_path: Path) -> None:
    pem, public = new_key_pair()
    (tmp_path / "key.pem").write_bytes(pem)
    signer = EventSigner(read_private_key(pem))
    publisher = Publisher(Settings(gpus=[], event_signing_key_file=tmp_path / "key.pem"), FakeProducer({}))
    chunk = slots(time.time())[0][:10]
    messages = [_message(event) for _, event in chunk]
    values = [value for _, value, _ in messages]
    records = _records(chunk, messages, [_sign(signer, values[:5]), _sign(signer, values[5:])])
    keys = EventKeys.parse([public])
    assert public_key_text(signer.public) == public
    for (t, event), (ms, key, value, headers) in zip(chunk, records, strict=True):
        sent = publisher.event_message(event)
        assert (key, value, headers) == (sent.key, sent.value, sent.headers)
        assert ms == int(t * 1000)
        keys.verify(value, headers)


def test_every_waiting_request_decodes_and_the_large_ones_weigh_just_under_the_limit() -> None:
    waiting = backlog(FLEET, time.time())
    limit = Settings(gpus=[]).max_message_bytes
    large = 0
    for w in waiting:
        value = request_body(w, limit)
        request = decode_request(value, w.request_id.encode())
        assert isinstance(request, RequestBase), request
        assert request.priority_class == w.priority_class and request.resources.gpus >= 2
        if w.large:
            large += 1
            assert 0.95 * limit < len(value) <= limit - COPY_HEADROOM_BYTES - len(w.request_id)
    assert large == FLEET.large
