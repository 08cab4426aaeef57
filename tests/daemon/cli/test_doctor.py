"""`adapterd doctor` against a real broker and the local Hub: one line a check, exit 1 when one fails
(an unreachable broker, a missing topic, a token the Hub refuses or one that cannot write where
requests push), exit 0 on a host ready for work."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaClient
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.protocol.admin import CreateAclsRequest
from pydantic import SecretStr
from typer.testing import CliRunner

from daemon.cli.app import app
from daemon.cli.checks.doctor import Check, _acls
from daemon.kafka.admin import acls
from daemon.kafka.admin.acl_recipe import Rule, recipe, verdict
from daemon.kafka.admin.acls import Acl, Writers, writers
from daemon.kafka.admin.topics import ensure_topics
from daemon.kafka.options import kafka_options
from daemon.kafka.retry_state import retry_key_id
from daemon.local_broker import LocalKafka
from daemon.settings import Settings
from schemas.signing import EventSigner, new_key_pair, read_private_key
from testbed.client import submit, terminal_events
from testbed.fleet_keys import shared_fleet_keys
from testbed.hub_server import HubServer
from testbed.processes import settings_environment
from tests.helpers import fleet_key

runner = CliRunner()
CLUSTER, LITERAL, PREFIXED, READ, DESCRIBE = 4, 3, 4, 3, 8  # Kafka's resource, pattern and operation codes
WHO = {
    "type": "user",
    "name": "ops-bot",
    "orgs": [{"name": "my-org", "roleInOrg": "write"}, {"name": "their-org", "roleInOrg": "read"}],
    "auth": {"accessToken": {"role": "write"}},
}


@pytest.fixture
def strict_hub() -> Iterator[HubServer]:
    """A Hub that knows one token (the session's Hub takes any)."""
    hub = HubServer(tokens={"hf_good": WHO}).start()
    yield hub
    hub.stop()


def doctor(settings: Settings, **changes: Any) -> tuple[int, dict[str, str]]:
    result = runner.invoke(app, ["doctor"], env=settings_environment(settings.model_copy(update=changes)))
    lines = {
        line[5:].split()[0]: line for line in result.output.splitlines() if line[:4] in ("ok  ", "FAIL", "--  ", "WARN")
    }
    return result.exit_code, lines


def test_a_host_ready_for_work(settings: Settings, strict_hub: HubServer) -> None:
    code, lines = doctor(
        settings,
        hub_endpoint=strict_hub.endpoint,
        hub_token=SecretStr("hf_good"),
        allowed_output_namespaces=["my-org", "ops-bot"],
    )
    assert code == 0, lines
    assert (
        lines["kafka"].startswith("ok")
        and lines["topics"].startswith("ok")
        and f"{settings.dlq_topic} (1 partitions)" in lines["topics"]
    )
    assert lines["hub"] == "ok   hub     token of ops-bot (write); pushes to my-org, ops-bot"
    # The session's broker is a local one (unless the suite runs against a cluster of its
    # own): doctor says what it runs on.
    local = set() if os.environ.get("ADAPTERD_TEST_BOOTSTRAP_SERVERS") else {"broker"}
    assert (
        set(lines)
        == {
            "kafka",
            "topics",
            "table",
            "acls",
            "events",
            "retry",
            "teams",
            "hub",
            "gpus",
            "ray",
            "disk",
            "store",
            "daemon",
        }
        | local
    )
    assert lines["table"] == f"ok   table   {settings.state_topic} compacted (cleanup.policy=compact), 1 partitions"
    if local:
        assert (
            lines["broker"].startswith("ok") and "runs on Java" in lines["broker"] and "kafka-jars-" in lines["broker"]
        ), lines["broker"]
    assert lines["store"].startswith("--") and "no" in lines["store"]  # none configured: nothing to check
    # The test broker has no authorizer: said plainly, as a warning that does not fail the host.
    topics = (
        f"{settings.requests_topic}, {settings.events_topic}, {settings.dlq_topic}, {settings.state_topic}, "
        f"{settings.control_topic}"
    )
    assert lines["acls"] == (
        "WARN acls    ACLs are not enabled on the brokers (no authorizer): anyone who reaches them can write every "
        f"topic ({topics}), put work in the fleet's queue and speak for the fleet; enable one and let only the fleet's "
        "principals write its topics (docs/guarantees.md)"
    )
    assert lines["events"].startswith("WARN") and "no event keys" in lines["events"]  # a warning, not a failure


def test_a_host_that_signs_its_events(settings: Settings, tmp_path: Path) -> None:
    pem, public = new_key_pair()
    (tmp_path / "key.pem").write_bytes(pem)
    code, lines = doctor(settings, event_signing_key_file=tmp_path / "key.pem", event_verify_keys=[new_key_pair()[1]])
    assert (
        lines["events"]
        == f"ok   events  signs its events with key {EventSigner(read_private_key(pem)).key_id}; trusts "
        "2 key(s) on the events it reads"
    )
    _, reader = doctor(settings, event_verify_keys=[public])  # an operator's machine, or a host not yet given the key
    assert (
        reader["events"].startswith("WARN")
        and "events go out unsigned, which readers holding keys ignore; trusts 1 key(s)" in reader["events"]
    )


def test_the_checkpoint_store_reachable_writable_and_what_this_host_wrote_verifies(
    settings: Settings, tmp_path: Path
) -> None:
    key = fleet_key(tmp_path)
    store = tmp_path / "store"
    store.mkdir(mode=0o755)
    code, lines = doctor(settings, checkpoint_store=str(store), event_signing_key_file=key)
    signer = EventSigner(read_private_key(key.read_bytes()))
    assert lines["store"] == (
        f"ok   store   {store} reachable and writable; a manifest signed with key "
        f"{signer.key_id} read back and verified"
    )
    assert list(store.iterdir()) == []  # the probe is gone
    store.chmod(0o777)
    _, lines = doctor(settings, checkpoint_store=str(store), event_signing_key_file=key)
    assert lines["store"].startswith("WARN") and "writable by others" in lines["store"]
    read_only = tmp_path / "read-only"
    read_only.mkdir(mode=0o555)
    code, lines = doctor(settings, checkpoint_store=str(read_only), event_signing_key_file=key)
    if os.geteuid() != 0:  # root writes anywhere
        assert code == 1 and lines["store"].startswith("FAIL") and "not writable by this host" in lines["store"]


def test_a_store_without_the_fleets_key_stops_the_doctor_as_it_stops_the_daemon(
    settings: Settings, tmp_path: Path
) -> None:
    result = runner.invoke(
        app, ["doctor"], env=settings_environment(settings.model_copy(update={"checkpoint_store": str(tmp_path)}))
    )
    assert result.exit_code == 2 and "checkpoint_store needs event_signing_key_file" in result.output


def test_the_fleets_retry_key_is_read_and_its_id_said_for_comparing_hosts(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "retry-key").write_text("the fleet retry key, 32 bytes ok\n")
    (tmp_path / "short").write_text("short\n")
    _, own = doctor(settings)
    assert own["retry"].startswith("--   retry   no retry_key_file: retries are signed with this host's own key")
    code, fleet = doctor(settings, retry_key_file=tmp_path / "retry-key")
    assert fleet["retry"] == (
        f"ok   retry   retry key {retry_key_id(b'the fleet retry key, 32 bytes ok')} from "
        f"{tmp_path / 'retry-key'} (the same id on every host of the fleet)"
    )
    other = tmp_path / "other-host"
    other.mkdir()
    (other / "retry-key").write_text("another host's key, not the fleet's\n")
    _, elsewhere = doctor(settings, retry_key_file=other / "retry-key")
    assert elsewhere["retry"].split()[4] != fleet["retry"].split()[4]  # two keys: two ids, told apart by an operator
    code, short = doctor(settings, retry_key_file=tmp_path / "short")
    assert (
        code == 1 and short["retry"].startswith("FAIL retry   retry_key_file") and "at least 16 bytes" in short["retry"]
    )
    code, missing = doctor(settings, retry_key_file=tmp_path / "missing")
    assert (
        code == 1
        and missing["retry"] == f"FAIL retry   retry_key_file {tmp_path / 'missing'}: No such file or directory"
    )
    classes = Settings(priority_classes=[{"name": "urgent"}], **shared_fleet_keys()).priority_classes
    code, classed = doctor(
        settings, priority_classes=classes, event_verify_keys=[new_key_pair()[1]]
    )  # a fleet's host without the key
    assert code == 1 and classed["retry"].startswith(
        "FAIL retry   no retry_key_file: with priority_classes the daemon does not start"
    )


def test_a_token_the_hub_refuses(settings: Settings, strict_hub: HubServer) -> None:
    code, lines = doctor(settings, hub_endpoint=strict_hub.endpoint, hub_token=SecretStr("hf_wrong"))
    assert code == 1 and lines["hub"].startswith("FAIL") and "refuses the token (HTTP 401)" in lines["hub"]


def test_a_token_that_cannot_write_where_requests_push(settings: Settings, strict_hub: HubServer) -> None:
    code, lines = doctor(
        settings,
        hub_endpoint=strict_hub.endpoint,
        hub_token=SecretStr("hf_good"),
        allowed_output_namespaces=["my-org", "their-org", "else"],
    )
    assert code == 1 and "ops-bot's, who cannot write to their-org, else" in lines["hub"]


def test_an_unreachable_broker(settings: Settings) -> None:
    code, lines = doctor(settings, bootstrap_servers="127.0.0.1:9")  # the discard port: nothing listens
    assert code == 1 and lines["kafka"].startswith("FAIL") and "no broker answers at 127.0.0.1:9" in lines["kafka"]
    assert lines["topics"].startswith("--") and lines["acls"] == "--   acls    not checked: Kafka does not answer"


def test_a_missing_topic(settings: Settings) -> None:
    missing = f"{settings.dlq_topic}-never-created"
    code, lines = doctor(settings, dlq_topic=missing)
    assert (
        code == 1
        and lines["topics"] == f"FAIL topics  missing: {missing}; create them (adapterd topics --partitions N)"
    )


def test_a_fleet_with_classes_needs_their_queues_and_the_claims_topic(settings: Settings) -> None:
    classed = settings.model_copy(
        update={
            "priority_classes": Settings(
                priority_classes=[{"name": "urgent"}, {"name": "default"}], **shared_fleet_keys()
            ).priority_classes,
            **shared_fleet_keys(),
            "default_priority_class": "default",
            "claims_topic": f"claims-{settings.group_id}",
        }
    )
    urgent = classed.class_topics["urgent"]
    code, lines = doctor(classed)
    assert (
        code == 1
        and lines["topics"]
        == f"FAIL topics  missing: {urgent}, {classed.claims_topic}; create them (adapterd topics --partitions N)"
    )
    asyncio.run(ensure_topics(classed))  # doctor runs its own event loop: this test has none
    code, lines = doctor(classed)
    assert (
        lines["topics"].startswith("ok")
        and f"{urgent} (1 partitions)" in lines["topics"]
        and classed.claims_topic in lines["topics"]
    )


async def test_a_running_daemon_and_its_fork_server(shared_settings: Settings, shared_daemon: Any) -> None:
    await submit(
        shared_settings, {"request_id": "doctor-turn", "schema_version": 1}
    )  # rejected: the daemon's loop turns
    await terminal_events(shared_settings, {"doctor-turn"})
    result = subprocess.run(
        [sys.executable, "-m", "daemon.cli.app", "doctor"],
        env=settings_environment(shared_settings),
        capture_output=True,
        text=True,
        timeout=120,
    )
    [line] = [line for line in result.stdout.splitlines() if line[5:].startswith("daemon")]
    assert line.startswith("ok   daemon  running: healthy True"), result.stdout
    assert "children start by fork, fork server " in line, line


def test_who_may_write_the_events_topic_by_kafkas_rule() -> None:
    me, ops = "User:adapterd", "User:ops"
    allow = [
        Acl(me, "*", acls.WRITE, acls.ALLOW, "adapterd.events"),
        Acl(ops, "10.0.0.9", acls.ALL, acls.ALLOW, "adapterd."),
    ]
    assert writers(allow, me) == Writers(me, True, (ops,))
    assert writers([*allow, Acl(me, "*", acls.WRITE, acls.DENY, "*")], me) == Writers(me, False, (ops,))  # a DENY wins
    assert writers([Acl(me, "*", READ, acls.ALLOW, "adapterd.events")], me).may_write is False  # Read is not Write
    anyone = writers([Acl(acls.ANYONE, "*", acls.WRITE, acls.ALLOW, "*")], me)
    assert anyone.may_write and anyone.anyone and anyone.others == (acls.ANYONE,)
    assert writers([], me) == Writers(me, False, ())  # no ACL: only super users


def test_every_topic_of_the_fleet_is_judged_against_who_the_recipe_lets_write_it() -> None:
    classed = Settings(
        priority_classes=[{"name": "urgent"}, {"name": "default"}, {"name": "batch"}],
        default_priority_class="default",
        **shared_fleet_keys(),
    )
    rules = {rule.topic: rule for rule in recipe(classed)}
    assert list(rules) == [
        "adapterd.requests",
        "adapterd.requests.urgent",
        "adapterd.requests.batch",
        "adapterd.claims",
        "adapterd.events",
        "adapterd.dlq",
        "adapterd.state",
        "adapterd.control",
    ]
    assert [topic for topic, rule in rules.items() if rule.fleet_writes and not rule.others] == [
        "adapterd.claims",
        "adapterd.events",
        "adapterd.dlq",
        "adapterd.state",
    ]
    assert "adapterd.claims" not in [rule.topic for rule in recipe(Settings())]  # no classes, no claims topic
    me = "User:adapterd"
    claims = rules["adapterd.claims"]
    assert (
        verdict(claims, Writers(me, True, ())) == verdict(claims, Writers(me, True, ()))
        and not verdict(claims, Writers(me, True, ())).warn
    )
    opened = verdict(claims, Writers(me, True, ("User:pipeline",)))
    assert (
        opened.ok and opened.warn and opened.text == "adapterd.claims: also User:pipeline; the recipe: the fleet alone"
    )
    assert not verdict(rules["adapterd.requests"], Writers(me, True, ("User:pipeline",))).warn  # producers submit there
    assert verdict(Rule("adapterd.requests.urgent", True, "producers"), Writers(me, True, (acls.ANYONE,))).warn
    assert not verdict(
        claims, Writers(me, False, ())
    ).ok  # the fleet may not write what it writes: its claims would be refused


async def _acls_applied(host: Settings, applied: Callable[[Check], bool], within_s: float = 30.0) -> Check:
    """The acls line once the brokers apply the ACLs just made: KRaft's authorizer takes them from its metadata log
    a moment after CreateAcls answers, and says nothing when it has (no event to await: asked again until then)."""
    async with asyncio.timeout(within_s):
        while not applied(check := await _acls(host)):
            await asyncio.sleep(0.2)
    return check


async def _create_acls(settings: Settings, *creations: tuple[int, str, int, str, int, int]) -> None:
    """ACLs made as the broker's super user (resource type, name, pattern type, principal, operation, permission)."""
    client = AIOKafkaClient(**kafka_options(settings))
    await client.bootstrap()
    try:
        for resource_type, name, pattern_type, principal, operation, permission in creations:
            response = await client.send(
                client.get_random_node(),
                CreateAclsRequest(resource_type, name, pattern_type, principal, "*", operation, permission),
            )
            assert all(error == 0 for error, _ in response.creation_responses), response
    finally:
        await client.close()


@pytest.mark.broker
async def test_the_acls_line_with_an_authorizer(tmp_path: Path) -> None:
    """A broker that enforces ACLs (KRaft's StandardAuthorizer; the plaintext listener's ANONYMOUS is
    its super user, the SASL listener's `adapterd` an ordinary principal): the line says whether the
    host's principal may write the events topic, and who else may."""
    broker = LocalKafka(
        data_dir=tmp_path / "kafka",
        properties={
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": "User:ANONYMOUS",
        },
    ).start()
    try:
        admin = Settings(bootstrap_servers=broker.bootstrap_servers, work_dir=tmp_path / "work")
        admin = admin.model_copy(
            update={
                "priority_classes": Settings(
                    priority_classes=[{"name": "urgent"}, {"name": "default"}], **shared_fleet_keys()
                ).priority_classes,
                "default_priority_class": "default",
            }
        )
        await ensure_topics(admin)
        host = admin.model_copy(
            update={
                "bootstrap_servers": broker.sasl_bootstrap_servers,
                "security_protocol": "SASL_PLAINTEXT",
                "sasl_mechanism": "SCRAM-SHA-256",
                "sasl_username": broker.scram_user,
                "sasl_password": SecretStr(broker.scram_password),
            }
        )
        me = f"User:{broker.scram_user}"
        topics = [rule.topic for rule in recipe(host)]
        assert topics == [
            "adapterd.requests",
            "adapterd.requests.urgent",
            "adapterd.claims",
            "adapterd.events",
            "adapterd.dlq",
            "adapterd.state",
            "adapterd.control",
        ]
        assert await _acls(host) == Check(
            "acls",
            None,
            f"{me} may not describe the brokers' ACLs (DESCRIBE on the cluster): who may "
            f"write {', '.join(topics)} is not known here (kafka-acls --list --topic TOPIC)",
        )
        await _create_acls(admin, (CLUSTER, "kafka-cluster", LITERAL, me, DESCRIBE, acls.ALLOW))
        refused = await _acls_applied(host, lambda check: check.ok is not None)
        assert refused.ok is False and refused.detail.startswith(f"{me} may not write what the fleet writes"), refused
        assert f"adapterd.claims: {me} may not (kafka-acls --add --allow-principal {me}" in refused.detail, refused
        # The recipe: the fleet writes its topics; producers the requests topic (and here,
        # directly, the urgent class's).
        await _create_acls(
            admin,
            *[(acls.TOPIC, topic, LITERAL, me, acls.WRITE, acls.ALLOW) for topic in topics[:-1]],
            (acls.TOPIC, "adapterd.requests", PREFIXED, "User:pipeline", acls.WRITE, acls.ALLOW),
            (acls.TOPIC, "adapterd.control", LITERAL, "User:ops", acls.WRITE, acls.ALLOW),
        )
        assert await _acls_applied(host, lambda check: "User:ops" in check.detail) == Check(
            "acls",
            True,
            (
                f"{me} may write what the fleet writes; who else may write each topic: adapterd.requests: also "
                "User:pipeline; adapterd.requests.urgent: also User:pipeline; adapterd.claims: the fleet alone; "
                "adapterd.events: the fleet alone; adapterd.dlq: the fleet alone; adapterd.state: the fleet alone; "
                "adapterd.control: User:ops"
            ),
        )
        # A producer let write the claims topic: said, by name, against the recipe.
        await _create_acls(admin, (acls.TOPIC, "adapterd.claims", LITERAL, "User:pipeline", acls.WRITE, acls.ALLOW))
        open_claims = await _acls_applied(host, lambda check: check.warn)
        assert (
            open_claims.ok
            and open_claims.warn
            and "adapterd.claims: also User:pipeline; the recipe: the fleet alone" in open_claims.detail
        )
        await _create_acls(admin, (acls.TOPIC, "*", LITERAL, acls.ANYONE, acls.WRITE, acls.ALLOW))
        anyone = await _acls_applied(host, lambda check: "anyone" in check.detail)
        assert (
            anyone.warn
            and anyone.ok
            and "adapterd.events: anyone (User:*); the recipe: the fleet alone" in anyone.detail
        )
    finally:
        broker.stop()


def test_a_state_topic_not_compacted_or_with_fewer_partitions_than_the_events_topic_fails(
    settings: Settings,
) -> None:
    async def made(name: str, partitions: int) -> None:
        admin = AIOKafkaAdminClient(**kafka_options(settings))
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1)])  # the broker's default: cleanup.policy=delete
            while name not in set(await admin.list_topics()):
                await asyncio.sleep(0.05)
        finally:
            await admin.close()

    deleting = f"{settings.state_topic}-deleting"
    asyncio.run(made(deleting, 1))
    code, lines = doctor(settings, state_topic=deleting)
    assert code == 1 and lines["table"].startswith(f"FAIL table   state_topic {deleting} is not compacted"), lines
    assert "cleanup.policy=delete" in lines["table"] and "--add-config cleanup.policy=compact," in lines["table"]
    code, lines = doctor(settings, state_topic=f"{settings.state_topic}-missing")
    assert code == 1 and "is missing: no daemon keeps the table; create it (adapterd topics)" in lines["table"]
    short = settings.model_copy(update={"events_topic": f"{settings.events_topic}-wide"})
    asyncio.run(made(short.events_topic, 2))
    code, lines = doctor(short)
    assert code == 1 and lines["table"] == (
        f"FAIL table   state_topic {settings.state_topic} has 1 partition(s), fewer than {short.events_topic}'s 2: "
        "no daemon keeps the table; adapterd topics --grow adds them"
    )


def test_the_ray_cluster_answers_and_its_folder_is_writable(settings: Settings, tmp_path: Path) -> None:
    """`[ray]`: the Jobs API asked for its version (a server on the loopback answering as Ray's dashboard does), the
    shared folder written; a cluster that does not answer fails the check, one that is not configured is said."""
    import http.server
    import json
    import threading

    class Dashboard(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps({"version": "4", "ray_version": "2.60.0"}).encode()
            self.send_response(200 if self.path == "/api/version" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    shared = tmp_path / "shared"
    shared.mkdir()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        _, lines = doctor(settings, ray={"address": address, "shared_dir": shared, "max_gpus": 16})
        assert lines["ray"] == f"ok   ray     {address}: Ray 2.60.0; 1 job(s) of up to 16 GPUs; folder {shared}"
        _, passing = doctor(settings, ray={"address": address, "shared_dir": shared, "pass_hub_token": True})
        assert passing["ray"].startswith("WARN") and "the Hub token goes to its workers" in passing["ray"]
        code, missing = doctor(settings, ray={"address": address, "shared_dir": tmp_path / "nowhere"})
        assert code == 1 and missing["ray"].startswith("FAIL") and "(ray.shared_dir)" in missing["ray"]
    finally:
        server.shutdown()
        server.server_close()
    code, away = doctor(settings, ray={"address": address, "shared_dir": shared})
    assert code == 1 and away["ray"].startswith(f"FAIL ray     the Jobs API at {address} does not answer")
    _, none = doctor(settings)
    assert none["ray"].startswith("--   ray     none: a request for more GPUs")
