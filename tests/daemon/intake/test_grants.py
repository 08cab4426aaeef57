"""Teams bound to their producers' keys (daemon/admission/grants.py, issue 61): once any team has a key, a
request is its team's only with a signature of one of that team's keys over its exact bytes, and runs
only in a class that team is granted; without keys nothing changes. Each branch of the check in process,
then as intake (requests and claims topics) and the dispatcher's head use it, on the fakes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition

from daemon.admission.grants import Grants
from daemon.fleet.moves import carried
from daemon.kafka.copies import MAX_SIGNATURE_BYTES
from daemon.kafka.retry_state import RetrySigner
from daemon.settings import Settings
from daemon.settings.fleet import CLASS_HEADER
from schemas import REQUEST_MODELS, RequestBase
from schemas.signing import (
    PRODUCER_SIGNATURE_HEADER,
    EventSigner,
    new_key_pair,
    producer_headers,
    public_key_text,
    read_private_key,
)
from testbed.fleet_keys import shared_fleet_keys
from tests.core import CoreOnFakes
from tests.daemon.core.test_scheduler_core import fails
from tests.fakes import FakeChildren, FakeRecord
from tests.helpers import sft_request

CLASSES = [{"name": "urgent"}, {"name": "batch", "preemptible": True}]


def signer() -> EventSigner:
    return EventSigner(read_private_key(new_key_pair()[0]))


ALPHA, BETA, DEFAULT = signer(), signer(), signer()


def teams(**extra: Any) -> dict[str, Any]:
    """Team alpha may use batch only; beta every class; `default` has a key too (requests that name no team)."""
    return {
        "alpha": {"producer_keys": [public_key_text(ALPHA.public)], "classes": ["batch"], **extra},
        "beta": {"producer_keys": [public_key_text(BETA.public)]},
        "default": {"producer_keys": [public_key_text(DEFAULT.public)]},
    }


def bound_settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "gpus": [],
        "warm_child": False,
        "work_dir": tmp_path / "work",
        "hub_token": None,
        "priority_classes": CLASSES,
        "teams": teams(),
        **shared_fleet_keys(),
        **overrides,
    }
    return Settings(**values)


def grants(teams_setting: dict[str, Any] | None = None) -> Grants:
    settings = Settings(
        priority_classes=CLASSES, teams=teams() if teams_setting is None else teams_setting, **shared_fleet_keys()
    )
    return Grants.from_settings(settings.teams)


def document(request_id: str, **fields: Any) -> dict[str, Any]:
    return sft_request(request_id, **fields)


def written(doc: dict[str, Any], by: EventSigner | None) -> tuple[RequestBase, bytes, list[tuple[str, bytes | None]]]:
    value = json.dumps(doc).encode()
    request = REQUEST_MODELS[doc["method"]].model_validate(doc)
    return request, value, list(producer_headers(by, value)) if by is not None else []


def refused(
    doc: dict[str, Any], by: EventSigner | None, priority_class: str | None = "batch", bound: Grants | None = None
) -> dict[str, str]:
    request, value, headers = written(doc, by)
    rejection = (bound or grants()).refusal(request, value, headers, priority_class)
    assert rejection is None or rejection.reason == "policy"
    return {} if rejection is None else {e.path: e.message for e in rejection.errors}


def test_a_request_signed_by_a_key_of_the_team_it_names_in_a_granted_class_is_taken() -> None:
    assert refused(document("a-1", team="alpha", priority_class="batch"), ALPHA) == {}
    assert (
        refused(document("b-1", team="beta", priority_class="urgent"), BETA, "urgent") == {}
    )  # no classes listed: every class


def test_a_request_naming_no_team_is_the_default_teams_and_needs_its_key() -> None:
    assert refused(document("d-1"), DEFAULT) == {}
    assert "not signed by a key of team 'default'" in refused(document("d-2"), ALPHA)["team"]


def test_a_producer_naming_another_team_is_refused_naming_team() -> None:
    errors = refused(document("a-2", team="beta"), ALPHA)
    assert errors.keys() == {"team"}
    assert (
        "not signed by a key of team 'beta'" in errors["team"]
        and f"signed by key {ALPHA.key_id}, a key of team 'alpha'" in errors["team"]
    )


def test_an_unsigned_request_is_refused_in_bound_mode() -> None:
    assert "has no adapterd-producer-signature header" in refused(document("u-1", team="alpha"), None)["team"]


def test_a_request_changed_after_it_was_signed_is_refused() -> None:
    doc = document("t-1", team="alpha", priority_class="batch")
    _, value, headers = written(doc, ALPHA)
    changed = {**doc, "metadata": {"by": "someone else"}}  # the bytes written again, alpha's signature kept
    request, tampered, _ = written(changed, None)
    rejection = grants().refusal(request, tampered, headers, "batch")
    assert rejection is not None and "does not match the record's bytes" in rejection.errors[0].message
    assert grants().refusal(REQUEST_MODELS["sft"].model_validate(doc), value, headers, "batch") is None


def test_a_key_no_team_holds_and_a_malformed_or_doubled_signature_are_refused() -> None:
    assert "which is no team's key" in refused(document("s-1", team="alpha"), signer())["team"]
    request, value, headers = written(document("s-2", team="alpha"), ALPHA)
    for bad in (
        [(PRODUCER_SIGNATURE_HEADER, b"ed25519:xx:notbase64")],
        headers * 2,
        [(PRODUCER_SIGNATURE_HEADER, None)],
    ):
        rejection = grants().refusal(request, value, bad, "batch")
        assert (
            rejection is not None and rejection.errors[0].path == "team" and "malformed" in rejection.errors[0].message
        )


def test_the_fleets_own_signature_header_does_not_count_as_the_producers() -> None:
    request, value, _ = written(document("h-1", team="alpha"), None)
    assert grants().refusal(request, value, [("adapterd-signature", ALPHA.sign(value))], "batch") is not None


def test_a_team_the_operator_does_not_list_is_refused_naming_team() -> None:
    errors = refused(document("n-1", team="vision-b"), ALPHA)
    assert (
        errors.keys() == {"team"}
        and "unknown team 'vision-b'" in errors["team"]
        and "alpha, beta, default" in errors["team"]
    )


def test_a_listed_team_without_keys_cannot_be_written_as() -> None:
    bound = grants({**teams(), "gamma": {"weight": 2}})
    assert "not signed by a key of team 'gamma'" in refused(document("g-1", team="gamma"), ALPHA, bound=bound)["team"]


def test_a_class_the_team_is_not_granted_is_refused_naming_priority_class() -> None:
    errors = refused(document("c-1", team="alpha", priority_class="urgent"), ALPHA, "urgent")
    assert errors == {"priority_class": "team 'alpha' may not use class 'urgent'; its classes: batch"}


def test_the_class_judged_is_the_one_it_runs_as_not_only_the_one_it_names() -> None:
    """A request naming no class, written straight into the urgent class's topic, runs as urgent: judged so."""
    assert refused(document("c-2", team="alpha"), ALPHA, "urgent").keys() == {"priority_class"}
    assert refused(document("c-3", team="alpha"), ALPHA, None) == {}  # a host without classes: no class to judge


def test_an_empty_class_list_grants_no_class() -> None:
    bound = grants({**teams(classes=[])})
    assert "its classes: none" in refused(document("c-4", team="alpha"), ALPHA, bound=bound)["priority_class"]


def test_open_mode_checks_nothing_and_says_teams_are_claims() -> None:
    open_grants = grants({"alpha": {"weight": 2, "classes": ["batch"]}})
    assert not open_grants.bound
    assert refused(document("o-1", team="anyone", priority_class="urgent"), None, "urgent", bound=open_grants) == {}
    assert open_grants.describe().startswith("open: a request's team and priority_class are claims")
    assert grants().describe().startswith("bound:") and "alpha (1 key(s), classes batch)" in grants().describe()


def test_settings_name_a_bad_key_a_missing_file_and_an_unknown_class(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"teams\.alpha\.producer_keys: key 1: not an Ed25519 public key"):
        Settings(teams={"alpha": {"producer_keys": ["nope"]}})
    with pytest.raises(ValueError, match=r"teams\.alpha\.producer_keys_file: cannot read"):
        Settings(teams={"alpha": {"producer_keys_file": tmp_path / "missing.pub"}})
    with pytest.raises(ValueError, match=r"teams\.alpha\.classes: unknown class 'gold'; expected one of urgent, batch"):
        Settings(priority_classes=CLASSES, teams={"alpha": {"classes": ["gold"]}}, **shared_fleet_keys())
    shared = [public_key_text(ALPHA.public)]
    with pytest.raises(ValueError, match=rf"teams\.beta\.producer_keys: key {ALPHA.key_id} is team alpha's too"):
        Settings(teams={"alpha": {"producer_keys": shared}, "beta": {"producer_keys": shared}})


def test_keys_are_read_from_a_teams_keys_file_as_well(tmp_path: Path) -> None:
    (tmp_path / "alpha.pub").write_text(f"# old and new\n{public_key_text(BETA.public)}\n")
    bound = grants(
        {"alpha": {"producer_keys": [public_key_text(ALPHA.public)], "producer_keys_file": tmp_path / "alpha.pub"}}
    )
    assert refused(document("f-1", team="alpha"), BETA, bound=bound) == {}
    assert refused(document("f-2", team="alpha"), ALPHA, bound=bound) == {}


def test_a_moved_request_keeps_its_producers_signature_and_only_a_signatures_size(tmp_path: Path) -> None:
    retries = RetrySigner.from_settings(None, tmp_path, 3)
    value = json.dumps(document("m-1", team="alpha")).encode()
    [signature] = producer_headers(ALPHA, value)
    kept = carried(FakeRecord("requests", 0, 0, b"m-1", value, [signature, ("x-other", b"y")]), retries)
    assert kept == (signature,)  # the signature, and none of the producer's other headers
    oversize = (PRODUCER_SIGNATURE_HEADER, b"e" * (MAX_SIGNATURE_BYTES + 1))
    assert carried(FakeRecord("requests", 0, 0, b"m-1", value, [oversize]), retries) == ()
    assert carried(FakeRecord("requests", 0, 0, b"m-1", value, [signature, signature]), retries) == ()


async def test_intake_rejects_and_dead_letters_another_teams_request_and_takes_the_honest_one(tmp_path: Path) -> None:
    core = CoreOnFakes(
        bound_settings(
            tmp_path, priority_classes=[], teams={k: {"producer_keys": v["producer_keys"]} for k, v in teams().items()}
        )
    )
    records = []
    for offset, (request_id, team, by) in enumerate([("x-1", "beta", ALPHA), ("x-2", "vision-b", ALPHA)]):
        _, value, headers = written(document(request_id, team=team), by)
        records.append(FakeRecord(core.tp.topic, 0, offset, request_id.encode(), value, headers))
    await core.intake.take(core.tp, records)
    await core.partitions.settled(core.tp)
    assert [(e["type"], e["errors"][0]["path"]) for e in core.events()] == [("rejected", "team"), ("rejected", "team")]
    assert [d.key for d in core.dead_letters()] == [b"x-1", b"x-2"] and core.consumer.committed[core.tp] == 2
    _, value, headers = written(document("x-3", team="beta"), BETA)
    await core.intake.take(core.tp, [FakeRecord(core.tp.topic, 0, 2, b"x-3", value, headers)])
    assert "x-3" not in {e["request_id"] for e in core.events() if e["type"] == "rejected"} and core.scheduler.holds(
        core.tp
    )


async def test_intake_judges_a_claim_by_the_class_the_dispatcher_gave_it(tmp_path: Path) -> None:
    settings = bound_settings(tmp_path)
    core = CoreOnFakes(settings)
    assert core.dispatcher is not None  # as Service wires a fleet's host
    tp = TopicPartition(settings.claims_topic, 0)
    core.consumer.committed[tp] = 0
    _, value, headers = written(document("k-1", team="alpha"), ALPHA)
    assert (
        core.intake.seal is not None
    )  # a claim the fleet wrote, as the dispatcher signs it (daemon/kafka/queue_seal.py)
    sealed = core.intake.seal.headers(tp.topic, 0, b"k-1", value, "urgent", "alpha", 1_000)
    claim = FakeRecord(tp.topic, 0, 0, b"k-1", value, [*headers, (CLASS_HEADER, b"urgent"), *sealed])
    await core.intake.take(tp, [claim])
    await core.partitions.settled(tp)
    [event] = core.events("k-1")
    assert event["type"] == "rejected" and event["errors"][0]["path"] == "priority_class"


async def test_the_dispatchers_head_rejects_a_team_or_class_not_granted_before_ordering_it(tmp_path: Path) -> None:
    settings = bound_settings(tmp_path)
    core = CoreOnFakes(settings)
    dispatcher = core.dispatcher
    assert dispatcher is not None
    urgent = next(q for q in dispatcher.queues if q.name == "urgent")
    tp = TopicPartition(urgent.topic, 0)

    async def head(request_id: str, by: EventSigner, **fields: Any) -> Any:
        _, value, headers = written(document(request_id, **fields), by)
        return await dispatcher.heads.read(urgent, tp, FakeRecord(tp.topic, 0, 0, request_id.encode(), value, headers))

    assert (await head("q-1", BETA, team="beta")).rejection is None  # beta may use urgent
    renamed = await head("q-2", ALPHA, team="vision-b")
    assert renamed.rejection is not None and [e.path for e in renamed.rejection.errors] == ["team"]
    # Alpha naming no class but written to urgent's topic runs as urgent, which it may not use.
    [not_granted, moved] = [
        await head("q-3", ALPHA, team="alpha"),
        await head("q-4", ALPHA, team="alpha", priority_class="batch"),
    ]
    assert not_granted.rejection is not None and [e.path for e in not_granted.rejection.errors] == ["priority_class"]
    assert moved.rejection is None and moved.moves_to == settings.class_topics["batch"]


async def test_the_announcer_tells_no_request_whose_team_or_class_the_dispatcher_would_refuse(tmp_path: Path) -> None:
    """The announcer judges a record's grant as the dispatcher's head does (once, as it decodes it): a request it
    would dead-letter is never told it waits."""
    from daemon.fleet.announcer import Announcer

    settings = bound_settings(tmp_path)
    core = CoreOnFakes(settings)
    dispatcher = core.dispatcher
    assert dispatcher is not None
    topic = settings.class_topics["urgent"]
    for request_id, by, fields in (
        ("granted", BETA, {"team": "beta"}),
        ("renamed", ALPHA, {"team": "vision-b"}),  # alpha's key, another team's name
        ("not-granted", ALPHA, {"team": "alpha"}),  # alpha may not use urgent
    ):
        _, value, headers = written(document(request_id, **fields), by)
        core.fleet.produce(topic, request_id.encode(), value, [(k, v) for k, v in headers if v is not None])
    announcer = Announcer(
        settings,
        dispatcher.view,
        core.publisher,
        core.partitions,
        dispatcher.retries,
        core.fleet.kafka().reads,
        core.scheduler.cancelled,
        core.intake.grants,
    )
    assert [each.waiting.request_id for each in await announcer.unread()] == ["granted"]


async def test_a_retry_keeps_its_producers_signature_and_is_taken_again(tmp_path: Path) -> None:
    """A retryable failure writes the request back to its partition: that copy is still its
    team's, so a bound host takes it."""
    settings = bound_settings(
        tmp_path,
        priority_classes=[],
        teams={"beta": {"producer_keys": [public_key_text(BETA.public)]}},
        max_attempts=2,
        retry_backoff_s=0,
    )
    core = CoreOnFakes(settings, children=FakeChildren(fails("dataset_unavailable", retryable=True)))
    _, value, headers = written(document("retried-1", team="beta"), BETA)
    await core.intake.take(core.tp, [FakeRecord(core.tp.topic, 0, 0, b"retried-1", value, headers)])
    await core.scheduler.jobs[core.tp].task
    [again] = core.requeued()
    assert again.header(PRODUCER_SIGNATURE_HEADER) == headers[0][1]
    copy = FakeRecord(core.tp.topic, 0, 1, again.key, again.value, list(again.headers))
    assert core.intake.grant_refusal(copy, core.request(copy)) is None  # not rejected as unsigned on its next attempt


@pytest.mark.parametrize("padding", [0, 70_000])
async def test_a_large_requests_producer_signature_is_checked_off_the_loop(
    tmp_path: Path, padding: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Verifying hashes every byte of the value: from OFF_LOOP_BYTES it runs in a thread, as decoding
    does; a small one on the loop."""
    import threading

    from daemon.decoding import OFF_LOOP_BYTES

    core = CoreOnFakes(bound_settings(tmp_path))
    threads: list[str] = []
    checked = Grants.refusal

    def refusal(self: Grants, *args: Any) -> Any:
        threads.append(threading.current_thread().name)
        return checked(self, *args)

    monkeypatch.setattr(Grants, "refusal", refusal)
    value = (
        json.dumps(document("big-1", team="beta")).encode() + b" " * padding
    )  # JSON's own whitespace: the same request, larger
    headers = list(producer_headers(BETA, value))
    assert (len(value) >= OFF_LOOP_BYTES) == bool(padding)
    await core.intake.take(core.tp, [FakeRecord(core.tp.topic, 0, 0, b"big-1", value, headers)])
    on_loop = threading.current_thread().name
    assert len(threads) == 1 and (threads[0] != on_loop) == bool(padding)
    assert "big-1" not in {e["request_id"] for e in core.events() if e["type"] == "rejected"}
