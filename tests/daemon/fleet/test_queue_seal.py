"""The fleet's signature on the queue's records (issue 61), without a broker: what it covers (a signature
moved to another key, value, topic, partition, class, team or arrival does not verify), the claims a
daemon refuses (intake, on the in-memory fakes: DLQ and `rejected`, never run), and a request's arrival
(the fleet's, never its producer's clock). Milliseconds."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from aiokafka import TopicPartition

from daemon.fleet.choice import LOG_APPEND_TIME, Arrivals
from daemon.kafka.queue_seal import SEAL_HEADER, QueueSeal, Unsealed, claim_refusal, signed_bytes
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER
from schemas.signing import EventKeys, EventSigner, new_key_pair, read_private_key
from tests.core import CoreOnFakes, turns_until
from tests.fakes import FakeRecord
from tests.helpers import sft_request

CLAIMS = "adapterd.claims"
URGENT = "adapterd.requests.urgent"
CLASSES = [{"name": "urgent"}, {"name": "default"}]


def fleet_key() -> EventSigner:
    return EventSigner(read_private_key(new_key_pair()[0]))


def seal_of(signer: EventSigner) -> QueueSeal:
    return QueueSeal(signer, EventKeys([signer.public]))


def claim(
    seal: QueueSeal,
    *,
    partition: int = 3,
    key: bytes | None = b"req-1",
    value: bytes = b'{"x": 1}',
    cls: str = "urgent",
    arrival_ms: int = 1_765_000_000_000,
) -> FakeRecord:
    headers = [(CLASS_HEADER, cls.encode()), *seal.headers(CLAIMS, partition, key, value, cls, "search", arrival_ms)]
    return FakeRecord(CLAIMS, partition, 7, key, value, headers)


def test_a_signed_record_reads_back_what_the_fleet_signed_and_a_moved_signature_does_not_verify() -> None:
    seal = seal_of(fleet_key())
    record = claim(seal)
    sealed = seal.read(record.topic, record.partition, record.key, record.value, record.headers)
    assert (sealed.arrival_ms, sealed.priority_class, sealed.team, sealed.partition) == (
        1_765_000_000_000,
        "urgent",
        "search",
        3,
    )
    signature = dict(record.headers)[SEAL_HEADER]
    assert signature is not None
    moved = {
        "another key": replace(record, key=b"req-2"),
        "a null key": replace(record, key=None),
        "another value": replace(record, value=b'{"x": 2}'),
        "another partition": replace(record, partition=4),
        "another topic": replace(record, topic=URGENT),
        "another class": replace(record, headers=[(SEAL_HEADER, signature.replace(b";urgent;", b";default;"))]),
        "another team": replace(record, headers=[(SEAL_HEADER, signature.replace(b";search;", b";oncall;"))]),
        "another arrival": replace(record, headers=[(SEAL_HEADER, signature.replace(b"1765000000000", b"1000"))]),
        "any partition": replace(record, headers=[(SEAL_HEADER, signature.replace(b";3;", b";;"))]),
        "unsigned": replace(record, headers=[(CLASS_HEADER, b"urgent")]),
        "two signatures": replace(record, headers=[(SEAL_HEADER, signature), (SEAL_HEADER, signature)]),
        "a null signature": replace(record, headers=[(SEAL_HEADER, None)]),
        "garbage": replace(record, headers=[(SEAL_HEADER, b"1;x;;urgent;search;ed25519:00:AA==")]),
    }
    for why, forged in moved.items():
        with pytest.raises(Unsealed):
            seal.read(forged.topic, forged.partition, forged.key, forged.value, forged.headers)
            pytest.fail(why)
    stranger = seal_of(fleet_key())  # another key pair: not the fleet's
    with pytest.raises(Unsealed, match="unknown_key"):
        seal.read(CLAIMS, 3, b"req-1", b'{"x": 1}', claim(stranger).headers)


def test_the_signed_bytes_are_one_encoding_whose_fields_cannot_run_into_each_other() -> None:
    from daemon.kafka.queue_seal import Sealed

    sealed = Sealed(1, "urgent", "search", None)
    assert signed_bytes("t", None, b"ab", b"c", sealed) != signed_bytes("t", None, b"a", b"bc", sealed)
    assert signed_bytes("t", None, None, b"", sealed) != signed_bytes("t", None, b"", b"", sealed)
    assert signed_bytes("t", None, b"k", b"v", sealed) != signed_bytes("t", 0, b"k", b"v", replace(sealed, partition=0))


def test_a_claim_is_refused_unless_the_fleet_signed_it_for_its_partition_and_its_one_class_header() -> None:
    seal = seal_of(fleet_key())
    good = claim(seal)
    assert claim_refusal(seal, good) is None
    forged_class = replace(
        good, headers=[(CLASS_HEADER, b"urgent"), *good.headers]
    )  # a second header a reader might take first
    anywhere = FakeRecord(
        CLAIMS,
        3,
        7,
        b"req-1",
        b"{}",
        [(CLASS_HEADER, b"urgent"), *seal.headers(CLAIMS, None, b"req-1", b"{}", "urgent", "s", 1)],
    )
    plain = FakeRecord(CLAIMS, 3, 7, b"req-1", b"{}", [(CLASS_HEADER, b"urgent")])
    relabelled = replace(good, headers=[(CLASS_HEADER, b"default"), *good.headers[1:]])
    for record in (forged_class, anywhere, plain, relabelled):
        assert claim_refusal(seal, record) is not None, record.headers
    assert "unsigned" in (claim_refusal(seal, plain) or "")
    # A host with no key at all checks nothing (the daemon refuses to start so); a host that checks
    # but cannot sign claims nothing.
    assert claim_refusal(QueueSeal(None, None), plain) is None and QueueSeal(None, None).writes_trusted
    assert not QueueSeal(None, EventKeys([fleet_key().public])).writes_trusted


def test_arrival_is_the_fleets_signed_one_else_the_brokers_append_time_else_this_hosts_first_read_never_the_producers() -> (  # noqa: E501 (the test's name says what it checks)
    None
):
    seal = seal_of(fleet_key())
    arrivals = Arrivals(seal)
    backdated = FakeRecord(URGENT, 0, 5, b"old", b"{}", [], timestamp=0)  # a producer's 1970, CreateTime
    first = arrivals.of("urgent", backdated)
    assert (
        first > 1_700_000_000_000 and arrivals.of("urgent", backdated) == first
    )  # this host's first read, kept on a re-read
    stamped = StampedRecord(
        URGENT, 0, 6, b"new", b"{}", [], timestamp=1_765_000_000_123, timestamp_type=LOG_APPEND_TIME
    )
    assert arrivals.of("urgent", stamped) == 1_765_000_000_123
    signed = FakeRecord(
        URGENT, 1, 9, b"k", b"{}", list(seal.headers(URGENT, 1, b"k", b"{}", "urgent", "s", 1_000)), timestamp=5
    )
    assert arrivals.of("urgent", signed) == 1_000  # a host's copy keeps the arrival the fleet signed
    assert arrivals.of("default", signed) != 1_000  # signed for another class's queue: a producer's
    forged = replace(signed, headers=[(SEAL_HEADER, dict(signed.headers)[SEAL_HEADER].replace(b";1000;", b";1;"))])  # type: ignore[union-attr]
    assert arrivals.of("urgent", forged) > 1_700_000_000_000


class StampedRecord(FakeRecord):
    """A record read from a LogAppendTime topic, as aiokafka's ConsumerRecord says it."""

    def __init__(self, *args: object, timestamp_type: int, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        object.__setattr__(self, "timestamp_type", timestamp_type)


@pytest.fixture
def fleet_settings(tmp_path: Path) -> Settings:
    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    return Settings(
        gpus=[],
        warm_child=False,
        work_dir=tmp_path / "work",
        priority_classes=CLASSES,
        default_priority_class="default",
        claims_topic=CLAIMS,
        event_signing_key_file=key,
    )


async def test_intake_dead_letters_a_claim_the_fleet_did_not_sign_and_runs_one_it_did(fleet_settings: Settings) -> None:
    core = CoreOnFakes(fleet_settings)
    tp = TopicPartition(CLAIMS, 3)
    core.consumer.committed[tp] = 0  # assigned to this member
    seal = QueueSeal.from_settings(fleet_settings)
    forged = json.dumps(sft_request("forged-1")).encode()
    genuine = json.dumps(sft_request("genuine-1")).encode()
    records = [
        FakeRecord(
            CLAIMS, 3, 0, b"forged-1", forged, [(CLASS_HEADER, b"urgent")]
        ),  # a plain producer's, its class its own word
        # A large one (its signature checked in a thread), and not even a request: refused as a claim first.
        FakeRecord(CLAIMS, 3, 1, b"forged-big", b"x" * 100_000, [(CLASS_HEADER, b"urgent")]),
        FakeRecord(
            CLAIMS,
            3,
            2,
            b"genuine-1",
            genuine,
            [(CLASS_HEADER, b"urgent"), *seal.headers(CLAIMS, 3, b"genuine-1", genuine, "urgent", "default", 1)],
        ),
    ]
    await core.intake.take(tp, records)
    await turns_until(lambda: "accepted" in core.types("genuine-1"))
    letters = core.dead_letters()
    assert [letter.key for letter in letters] == [b"forged-1", b"forged-big"]
    assert {letter.header("adapterd-reason") for letter in letters} == {b"unverified_claim"}
    assert all(b"unsigned" in (letter.header("adapterd-errors") or b"") for letter in letters)
    [rejected] = core.events("forged-1")
    assert (
        rejected["type"] == "rejected"
        and rejected["reason"] == "unverified_claim"
        and "unsigned" in rejected["errors"][0]["message"]
    )
    assert core.types("genuine-1")[0] == "accepted" and "accepted" not in core.types("forged-1")


async def test_a_claimed_requests_retry_and_a_preempted_ones_arrival_are_the_fleets(fleet_settings: Settings) -> None:
    core = CoreOnFakes(fleet_settings)
    assert core.dispatcher is not None
    jobs = core.dispatcher.jobs  # the scheduler's fleet hooks
    seal = jobs.mover.seal
    body = json.dumps(sft_request("retried-1", team="search")).encode()
    claimed = FakeRecord(
        CLAIMS,
        2,
        4,
        b"retried-1",
        body,
        [(CLASS_HEADER, b"urgent"), *seal.headers(CLAIMS, 2, b"retried-1", body, "urgent", "search", 1_234)],
        timestamp=99,
    )
    assert jobs.arrival_ms(claimed) == 1_234  # what the fleet signed, not the claim's timestamp
    retry = jobs.requeued(claimed, CoreOnFakes.request(claimed), core.publisher.retry_copy(claimed, []))
    assert retry.topic == fleet_settings.class_topics["urgent"]
    sealed = seal.read(retry.topic, 0, retry.key, retry.value, retry.headers)
    assert (sealed.priority_class, sealed.team, sealed.partition) == ("urgent", "search", None)
