"""The queue's topics are the fleet's (issue 61), end to end on the real broker with a real daemon: a
record a plain producer writes straight to the claims topic is never run (DLQ and `rejected`, the
request queued before it runs), nor is a genuine claim replayed into another partition, relabelled with
another class or its signature moved to another request; a record backdated to 1970 does not go first;
a flood of undecodable records in a class's queue costs no claim and no rejoin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.structs import ConsumerRecord

from daemon.kafka.admin.topics import partition_numbers
from daemon.kafka.event_reader import EventStream
from daemon.kafka.options import kafka_options
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER
from schemas import Accepted, Cancel, Progress, Rejected, Succeeded
from schemas.signing import new_key_pair
from testbed.client import produce, records_of, terminal_events
from testbed.hub_server import HubServer
from testbed.processes import DaemonProcess
from tests.daemon.fleet.test_fleet_queue import fleet, hosts, of, request, submit_to

pytestmark = pytest.mark.slow

REPLAY_TIMEOUT_S = 90.0  # a refused record's dead letter comes within seconds; one that ran instead never does


async def signed_fleet(settings: Settings, tmp_path: Path) -> Settings:
    key = tmp_path / "event-signing-key.pem"
    key.write_bytes(new_key_pair()[0])
    return await fleet(settings, event_signing_key_file=key)


async def busy_until_cancelled(host: Settings, request_id: str, priority_class: str) -> None:
    """A job that trains longer than the test runs, holding the host's one slot: the queue waits behind it."""
    async with EventStream(host) as stream:
        await submit_to(
            host, host.class_topics[priority_class], request(request_id, 100_000, priority_class=priority_class)
        )
        async for event in stream.events(request_id):
            if isinstance(event, Progress):
                return


async def cancel(host: Settings, request_id: str) -> None:
    await produce(
        host,
        Cancel(request_id=request_id, reason="done with it").model_dump_json().encode(),
        request_id.encode(),
        topic=host.control_topic,
    )


async def test_a_claim_the_fleet_did_not_write_is_dead_lettered_and_never_run_and_the_request_queued_before_it_runs(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
) -> None:
    (host,) = hosts(await signed_fleet(settings, tmp_path), tmp_path, "host-a")
    daemon = DaemonProcess(host, tmp_path / "host-a.log").start()
    try:
        await busy_until_cancelled(host, "busy-1", "batch")
        await submit_to(host, host.class_topics["default"], request("queued-1", 2))  # waits for the one slot
        # A plain producer's request, straight into every claims partition, claiming the
        # highest class in its own header.
        forged = json.dumps(request("forged-1", 2, priority_class="urgent")).encode()
        for partition in sorted(await partition_numbers(host, host.claims_topic)):
            await produce(
                host, forged, b"forged-1", host.claims_topic, partition=partition, headers=[(CLASS_HEADER, b"urgent")]
            )
        await cancel(host, "busy-1")  # the slot frees: the genuine request takes it
        events = await terminal_events(host, {"busy-1", "queued-1", "forged-1"})
        letters = await records_of(
            host, host.dlq_topic, [b"forged-1"], count=len(await partition_numbers(host, host.claims_topic))
        )

        # Replays of the genuine claim: into another partition, relabelled to another class,
        # its signature on another request.
        [claim] = await records_of(host, host.claims_topic, [b"queued-1"])
        other = (claim.partition + 1) % len(await partition_numbers(host, host.claims_topic))
        relabelled = [(name, b"urgent" if name == CLASS_HEADER else value) for name, value in claim.headers]
        await produce(host, claim.value, claim.key, host.claims_topic, partition=other, headers=list(claim.headers))
        await produce(host, claim.value, claim.key, host.claims_topic, partition=claim.partition, headers=relabelled)
        await produce(
            host,
            json.dumps(request("replayed-1", 2)).encode(),
            claim.key,
            host.claims_topic,
            partition=claim.partition,
            headers=list(claim.headers),
        )
        letters_of_replays = await records_of(host, host.dlq_topic, [b"queued-1"], count=3, timeout_s=REPLAY_TIMEOUT_S)
        replayed = await terminal_events(host, {"replayed-1"}, timeout_s=REPLAY_TIMEOUT_S)
    finally:
        daemon.stop()
    assert not of(events["forged-1"], Accepted)  # never run, in any of its claims
    refused = of(events["forged-1"], Rejected)
    assert refused and all(
        event.reason == "unverified_claim" and "unsigned" in event.errors[0].message for event in refused
    )
    assert all(dict(letter.headers)["adapterd-reason"] == b"unverified_claim" for letter in letters)
    assert [event.host for event in of(events["queued-1"], Accepted)] == ["host-a"] and of(
        events["queued-1"], Succeeded
    )

    # Each replay refused, its reason said: none ran (a run would have published an event and written no dead letter).
    def which(
        letter: ConsumerRecord[bytes, bytes],
    ) -> str:  # each replay's dead letter, by where it was written and what
        if int(dict(letter.headers)["adapterd-source-partition"]) == other:
            return "partition"
        return "signature" if b"replayed-1" in letter.value else "class"

    replays = {which(letter): letter for letter in letters_of_replays}
    assert sorted(replays) == ["class", "partition", "signature"]
    assert {dict(letter.headers)["adapterd-reason"] for letter in replays.values()} == {b"unverified_claim"}
    reasons = {
        which: json.loads(dict(letter.headers)["adapterd-errors"])[0]["message"] for which, letter in replays.items()
    }
    assert (
        "signed for partition" in reasons["partition"]
        and CLASS_HEADER in reasons["class"]
        and "bad_signature" in reasons["signature"]
    ), reasons
    assert [event.type for event in replayed["replayed-1"]] == ["rejected"]


async def test_a_backdated_request_does_not_go_first_and_a_flood_of_undecodable_records_costs_no_claim_and_no_rejoin(
    settings: Settings,
    published: HubServer,
    tmp_path: Path,
) -> None:
    (host,) = hosts(await signed_fleet(settings, tmp_path), tmp_path, "host-a")
    queue = host.class_topics["batch"]  # made by `adapterd topics`' code (tests' `fleet`): the broker stamps arrival
    daemon = DaemonProcess(host, tmp_path / "host-a.log").start()
    try:
        await busy_until_cancelled(host, "busy-2", "default")
        await submit_to(host, queue, request("on-time", 2, priority_class="batch"), key=b"a")
        await produce(
            host,
            json.dumps(request("backdated", 2, priority_class="batch")).encode(),
            b"b",
            queue,
            partition=1,
            timestamp_ms=0,
        )
        await cancel(host, "busy-2")
        ordered = await terminal_events(host, {"busy-2", "on-time", "backdated"})
        flood = 200
        producer = AIOKafkaProducer(**kafka_options(host), acks="all")
        await producer.start()
        try:  # ahead of a valid request in one partition: each one its own undecodable record
            for number in range(flood):
                await producer.send(queue, b"not a request %d" % number, key=b"flood", partition=0)
            await producer.flush()
        finally:
            await producer.stop()
        await submit_to(host, queue, request("after-flood", 2, priority_class="batch"), key=b"flood")
        after = await terminal_events(host, {"after-flood"})
        letters = await records_of(host, host.dlq_topic, [b"flood"], count=flood)
    finally:
        daemon.stop()
    [on_time], [backdated] = of(ordered["on-time"], Accepted), of(ordered["backdated"], Accepted)
    assert on_time.time < backdated.time  # on the broker's clock, not the producer's 1970
    assert of(after["after-flood"], Succeeded)
    assert {dict(letter.headers)["adapterd-reason"] for letter in letters} == {b"not_json"}
    lines = daemon.log_lines()
    claimed = [line["request_id"] for line in lines if line.get("event") == "fleet.claimed"]
    assert sorted(claimed) == ["after-flood", "backdated", "busy-2", "on-time"]  # not one claim for the 200
    # Between the claim before the flood and the one after it, the slot freed once: each class's group joined again
    # once at most. Each of the 200 claimed would have made the host leave its groups and join them again.
    claims = {line["request_id"]: number for number, line in enumerate(lines) if line.get("event") == "fleet.claimed"}
    joins = [
        line for line in lines[claims["backdated"] : claims["after-flood"]] if line.get("event") == "fleet.queue_joined"
    ]
    assert len(joins) <= len(host.class_topics), joins
