"""Fuzzing of records, not only values (issue 37): Hypothesis draws whole Kafka records (headers of
any name and value, the daemon's own names among them, null and binary keys and values, any
timestamp, the hostile request values of tests/schemas/test_fuzz_hostile.py or a valid request)
and drives `Intake.take` on the in-memory fakes (tests/core.py).

Properties, for every record: nothing raises out of intake; exactly one outcome (a `rejected`
event with its DLQ record, or `accepted` and one terminal event); none is `internal` (the guard
that keeps the daemon up met a bug); the daemon's DLQ copies fit `max_message_bytes`. `ADAPTERD_FUZZ_EXAMPLES`
sets how many (200 by default).
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.kafka.retry_state import RETRY_HEADERS
from daemon.settings import Settings
from tests.core import CoreOnFakes
from tests.daemon.core.test_scheduler_core import SUCCEEDS
from tests.fakes import FakeChildren, FakeRecord
from tests.helpers import sft_request
from tests.schemas.test_fuzz_hostile import hostile_messages

FUZZ_EXAMPLES = int(os.environ.get("ADAPTERD_FUZZ_EXAMPLES", "200"))
LIMIT = 65_536

NAMES = st.one_of(
    st.sampled_from([*RETRY_HEADERS, "traceparent", "tracestate", "adapterd-reason", "adapterd-errors", ""]),
    st.text(max_size=20),
)
VALUES = st.one_of(
    st.none(),
    st.binary(max_size=64),
    st.sampled_from([b"99", b"inf", b"-1", b"nan", b"0" * 40, b"\xff\xfe"]),
    st.text(max_size=20).map(str.encode),
)
VALID = json.dumps(sft_request("fuzz-valid")).encode()


@st.composite
def records(draw: st.DrawFn) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int]:
    value = draw(
        st.one_of(
            st.just(VALID),
            hostile_messages(),
            st.none(),
            st.binary(max_size=64),
            st.integers(LIMIT - 9000, LIMIT + 10).map(
                lambda n: VALID[:-1] + b', "metadata": {"p": "' + b"a" * n + b'"}}'
            ),
        )
    )
    key = draw(st.one_of(st.none(), st.binary(max_size=16), st.just(b"fuzz-valid")))
    headers = draw(st.lists(st.tuples(NAMES, VALUES), max_size=12))
    timestamp = draw(st.one_of(st.integers(-(2**63), 2**63 - 1), st.just(-1)))
    return key, value, headers, timestamp


async def take(record: FakeRecord, work: Path) -> CoreOnFakes:
    core = CoreOnFakes(
        Settings(
            gpus=[], warm_child=False, work_dir=work, hub_token=None, max_message_bytes=LIMIT, progress_interval_s=0
        ),
        children=FakeChildren(SUCCEEDS),
    )
    await core.intake.take(core.tp, [record])  # raises nothing, whatever the record
    await core.partitions.settled(core.tp)
    job = core.scheduler.jobs.get(core.tp)
    if job is not None:
        await job.task
    return core


@settings(
    max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(records())
def test_every_record_ends_in_exactly_one_outcome_and_its_copies_fit(
    drawn: tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]], int],
) -> None:
    key, value, headers, timestamp = drawn
    record = FakeRecord("requests", 0, 5, key, value, headers, timestamp)
    with tempfile.TemporaryDirectory() as work:
        core = asyncio.run(take(record, Path(work)))
    types = [json.loads(m.value)["type"] for m in core.producer.on(core.settings.events_topic)]
    terminal = [t for t in types if t in {"rejected", "succeeded", "failed", "cancelled"}]
    assert len(terminal) == 1, types
    assert (types == ["rejected"]) == (len(core.dead_letters()) == 1), types
    # `internal` is the guard catching a bug of ours: the record is safe, but the bug is a finding.
    assert [m.header("adapterd-reason") for m in core.dead_letters()] != [b"internal"], core.dead_letters()[0].headers
    for copy in core.dead_letters():
        assert len(copy.key or b"") + len(copy.value) + sum(len(n) + len(v) for n, v in copy.headers) <= LIMIT
    assert core.consumer.committed.get(core.tp) == 6
