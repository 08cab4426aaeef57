"""`adapterd doctor`: a host checked before it takes work, one line a check.

What an operator otherwise learns only from a job that fails after training: a broker it cannot
reach, a topic nobody created, a Hub token that is wrong or cannot write where requests push, no
GPU, a Ray cluster that does not answer, a work folder it cannot write or a disk nearly full, a checkpoint store it
cannot reach, write or verify what it wrote there. Each check says what it found; a check
that fails says what to do. The settings themselves are checked by loading them (exit 2 on a bad
one, as `run` does). Run it when a host is set up or changed (deploy/README.md), not from the unit's
`ExecStartPre=`: a Hub or broker outage would then keep every host from starting, where a running
daemon waits for the broker and retries a push.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import ClusterAuthorizationFailedError, KafkaError, SecurityDisabled

from daemon.admission.grants import Grants
from daemon.cli.checks.store import store_check
from daemon.cli.checks.topics import table_verdict, topics_verdict
from daemon.kafka.admin.acl_recipe import recipe, verdict
from daemon.kafka.admin.acls import principal_of, topics_acls, writers
from daemon.kafka.admin.topics import described_config
from daemon.kafka.options import kafka_options
from daemon.kafka.retry_state import load_key, retry_key_id
from daemon.local_broker.running import local_broker_at
from daemon.ops.local_endpoint import local_url
from daemon.resources.kinds import host_gpus
from daemon.resources.slots import discover_gpus
from daemon.settings import Settings
from daemon.settings.secret_files import event_keys, event_signer
from daemon.store.retention import existing_folder, free_bytes

# Below this much free space in work_dir the disk check fails: a job's checkpoints and its base
# model's files need several GiB.
MIN_FREE_BYTES = 10 * 2**30
KAFKA_TIMEOUT_S = 15.0
# Roles in an organization that may push to it (whoami's `roleInOrg`).
WRITE_ROLES = {"admin", "write", "contributor"}


@dataclass(frozen=True)
class Check:
    """One line of the doctor's report; `ok` None: nothing to check here (said, not failed); `warn`:
    the host can work, but something around it is open that should not be (said, not failed)."""

    name: str
    ok: bool | None
    detail: str
    warn: bool = False

    def line(self) -> str:
        mark = "WARN" if self.warn else {True: "ok  ", False: "FAIL", None: "--  "}[self.ok]
        return f"{mark} {self.name:<7} {self.detail}"


async def examine(settings: Settings) -> list[Check]:
    """Every check, in the order an operator mends them."""
    kafka, topics, table = await _kafka(settings)
    acls = await _acls(settings) if kafka.ok else Check("acls", None, "not checked: Kafka does not answer")
    store = Check("store", *await asyncio.to_thread(store_check, settings))
    broker = _local_broker(settings)
    return [
        kafka,
        *broker,
        topics,
        table,
        acls,
        _events(settings),
        _retry(settings),
        _teams(settings),
        await asyncio.to_thread(_hub, settings),
        _gpus(settings),
        await asyncio.to_thread(_ray, settings),
        _disk(settings),
        store,
        _daemon(settings),
    ]


async def _kafka(settings: Settings) -> tuple[Check, Check, Check]:
    names = [settings.requests_topic, settings.events_topic, settings.dlq_topic, settings.control_topic]
    # With priority classes the fleet also reads each class's queue and runs from the claims topic (the default
    # class's queue is the requests topic itself): a host missing one would never start that class's requests.
    queues = [topic for topic in settings.class_topics.values() if topic not in names]
    names += [*queues, settings.claims_topic] if settings.class_topics else []
    admin = AIOKafkaAdminClient(**kafka_options(settings), request_timeout_ms=int(KAFKA_TIMEOUT_S * 1000))
    try:
        async with asyncio.timeout(KAFKA_TIMEOUT_S):
            await admin.start()
            # Only listed topics are described: a metadata request naming a missing topic lets a broker with
            # auto.create.topics.enable make it, with its default partitions, and the check would then pass.
            existing = set(await admin.list_topics())
            table = [settings.state_topic] if settings.state_topic in existing else []
            described = (
                await admin.describe_topics([name for name in [*names, *table] if name in existing])
                if existing & {*names, *table}
                else []
            )
            config = await described_config(admin, settings.state_topic) if table else {}
    except (KafkaError, TimeoutError, OSError) as exc:
        reason = str(exc) or type(exc).__name__  # aiokafka's errors name their class themselves
        return (
            Check("kafka", False, f"no broker answers at {settings.bootstrap_servers}: {reason}"),
            Check("topics", None, "not checked: Kafka does not answer"),
            Check("table", None, "not checked: Kafka does not answer"),
        )
    finally:
        await admin.close()
    partitions = {entry["topic"]: len(entry["partitions"]) for entry in described if entry.get("partitions")}
    kafka = Check("kafka", True, f"{settings.bootstrap_servers} answers")
    slots = len(discover_gpus(settings.gpus)) or settings.job_slots
    return (
        kafka,
        Check("topics", *topics_verdict(settings, names, partitions, slots)),
        Check("table", *table_verdict(settings, partitions, config)),
    )


def _local_broker(settings: Settings) -> list[Check]:
    """When the settings name a local broker of this machine's (`adapterd demo --keep` writes such settings), what it
    runs on: a line only then, since an operator's broker is not ours to describe."""
    found = local_broker_at(settings.bootstrap_servers)
    if found is None:
        return []
    return [
        Check(
            "broker",
            True,
            f"the local broker (pid {found['pid']}) runs on Java {found['java_version']} ({found['java_origin']}: "
            f"{found['java']}), its jars in {found['jars']}",
        )
    ]


async def _acls(settings: Settings) -> Check:
    """Who may write each of the fleet's topics, against docs/guarantees.md's recipe (daemon/kafka/admin/acl_recipe.py):
    this host's principal must write what the fleet writes, and no one else may write the claims topic (a claim
    is run), the events topic (a consumer acts on an event) or the DLQ."""
    rules, principal = recipe(settings), principal_of(settings)
    topics = ", ".join(rule.topic for rule in rules)
    try:
        async with asyncio.timeout(KAFKA_TIMEOUT_S):
            found = await topics_acls(settings, [rule.topic for rule in rules], int(KAFKA_TIMEOUT_S * 1000))
    except SecurityDisabled:
        return Check(
            "acls",
            None,
            f"ACLs are not enabled on the brokers (no authorizer): anyone who reaches them can write every topic "
            f"({topics}), put work in the fleet's queue and speak for the fleet; enable one and let only the "
            "fleet's principals write its topics (docs/guarantees.md)",
            warn=True,
        )
    except ClusterAuthorizationFailedError:
        return Check(
            "acls",
            None,
            f"{principal} may not describe the brokers' ACLs (DESCRIBE on the cluster): who may write {topics} "
            f"is not known here (kafka-acls --list --topic TOPIC)",
        )
    except (KafkaError, TimeoutError, OSError) as exc:
        return Check("acls", None, f"the brokers did not say who may write {topics}: {str(exc) or type(exc).__name__}")
    verdicts = [verdict(rule, writers(found[rule.topic], principal)) for rule in rules]
    said = "; ".join(v.text for v in verdicts)
    if not all(v.ok for v in verdicts):
        return Check(
            "acls", False, f"{principal} may not write what the fleet writes; who may write each topic: {said}"
        )
    return Check(
        "acls",
        True,
        f"{principal} may write what the fleet writes; who else may write each topic: {said}",
        warn=any(v.warn for v in verdicts),
    )


def _events(settings: Settings) -> Check:
    """Whether this host signs its events and checks those it reads (docs/guarantees.md): a warning,
    not a failure, without a key; the settings already refused a key that cannot be read."""
    signer, keys = event_signer(settings), event_keys(settings)
    trusted = f"; trusts {len(keys)} key(s) on the events it reads" if keys is not None else ""
    if signer is None and keys is None:
        return Check(
            "events",
            None,
            "no event keys: this host's events go out unsigned, and it reads events unverified "
            "(adapterd keys; docs/guarantees.md)",
            warn=True,
        )
    if signer is None:
        return Check(
            "events",
            None,
            "no event_signing_key_file: this host's events go out unsigned, which "
            f"readers holding keys ignore{trusted}",
            warn=True,
        )
    return Check("events", True, f"signs its events with key {signer.key_id}{trusted}")


def _retry(settings: Settings) -> Check:
    """The key that signs a retry's and a preemption's counts (daemon/kafka/retry_state.py): one for the fleet, read
    now, and its id said so that the hosts' can be compared (the same id on every host: the same key). A daemon with
    priority classes does not start without one (daemon/fleet/wiring.py)."""
    path = settings.retry_key_file
    if path is None and settings.priority_classes:
        return Check(
            "retry",
            False,
            "no retry_key_file: with priority_classes the daemon does not start without one key for the fleet "
            "(deploy/README.md)",
        )
    if path is None:
        return Check(
            "retry",
            None,
            f"no retry_key_file: retries are signed with this host's own key ({settings.work_dir / 'retry-key'}); "
            "another host reads their counts as a first try",
        )
    try:
        key = load_key(path, settings.work_dir)
    except (OSError, ValueError) as exc:
        return Check(
            "retry",
            False,
            f"retry_key_file {path}: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}",
        )
    return Check("retry", True, f"retry key {retry_key_id(key)} from {path} (the same id on every host of the fleet)")


def _teams(settings: Settings) -> Check:
    """Whether a request's team and class are bound to its producer's key (daemon/admission/grants.py): a warning in
    open mode, where they are claims any producer may make."""
    grants = Grants.from_settings(settings.teams)
    return Check("teams", True if grants.bound else None, grants.describe(), warn=not grants.bound)


def _hub(settings: Settings) -> Check:
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError

    if settings.hub_token is None:
        return Check("hub", None, f"no token: artifacts go to the local sink, {settings.work_dir / 'outputs'}")
    try:
        who = HfApi(endpoint=settings.hub_endpoint, token=settings.hub_token.get_secret_value()).whoami()
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return Check("hub", False, f"{settings.hub_endpoint} refuses the token (HTTP {status}): replace it")
        return Check("hub", False, f"{settings.hub_endpoint} answered {status}: {str(exc).splitlines()[0]}")
    except OSError as exc:
        return Check("hub", False, f"{settings.hub_endpoint} does not answer: {exc}")
    name = who.get("name", "?")
    role = (who.get("auth") or {}).get("accessToken", {}).get("role")
    if role == "read":
        return Check("hub", False, f"the token of {name} is a read token: it cannot push; use one with write access")
    roles = {org.get("name"): org.get("roleInOrg") for org in who.get("orgs") or []}
    cannot = [
        namespace
        for namespace in settings.allowed_output_namespaces
        if namespace != name
        and (namespace not in roles or (roles[namespace] is not None and roles[namespace] not in WRITE_ROLES))
    ]
    if cannot:
        return Check(
            "hub", False, f"the token is {name}'s, who cannot write to {', '.join(cannot)} (allowed_output_namespaces)"
        )
    namespaces = ", ".join(settings.allowed_output_namespaces) or "any namespace the token can write"
    return Check("hub", True, f"token of {name}{f' ({role})' if role else ''}; pushes to {namespaces}")


def _gpus(settings: Settings) -> Check:
    gpus = discover_gpus(settings.gpus)
    if not gpus:
        return Check("gpus", None, f"none: jobs run on the CPU, {settings.job_slots} at a time")
    # Their kind, as requests' resources.gpu_kind name it (detected, or the operator's gpu_kind).
    return Check("gpus", True, f"{len(gpus)}: {', '.join(gpus)}; {host_gpus(settings, gpus).said()}")


def _ray(settings: Settings) -> Check:
    """The Ray cluster requests bigger than this host run on (`[ray]`): its Jobs API answers, the client is installed,
    the shared folder is writable here; warned when the Hub token is passed to its workers."""
    ray = settings.ray
    if ray is None:
        return Check("ray", None, "none: a request for more GPUs than this host has is rejected (resources.gpus)")
    if importlib.util.find_spec("ray") is None:
        return Check("ray", False, "the Ray client is not installed here: install adapterd's `ray` extra")
    try:
        with urllib.request.urlopen(f"{ray.address.rstrip('/')}/api/version", timeout=10) as answer:
            version = json.loads(answer.read(65_536)).get("ray_version", "?")
    except (OSError, ValueError) as exc:
        return Check("ray", False, f"the Jobs API at {ray.address} does not answer: {exc}")
    if not (ray.shared_dir.is_dir() and os.access(ray.shared_dir, os.W_OK)):
        return Check("ray", False, f"{ray.shared_dir} (ray.shared_dir) is not a folder this user can write")
    said = f"{ray.address}: Ray {version}; {ray.max_jobs} job(s) of up to {ray.max_gpus} GPUs; folder {ray.shared_dir}"
    if ray.pass_hub_token:
        return Check("ray", True, f"{said}; the Hub token goes to its workers (pass_hub_token)", warn=True)
    return Check("ray", True, said)


def _disk(settings: Settings) -> Check:
    existing = existing_folder(settings.work_dir)
    if existing == settings.work_dir and not os.access(existing, os.W_OK):
        return Check("disk", False, f"{existing} is not writable by this user")
    free = free_bytes(existing)
    if free < MIN_FREE_BYTES:
        return Check(
            "disk",
            False,
            f"{free / 2**30:.1f} GiB free under {existing}; a job needs {MIN_FREE_BYTES / 2**30:.0f} GiB or more",
        )
    return Check("disk", True, f"{free / 2**30:.0f} GiB free under {existing}")


def _daemon(settings: Settings) -> Check:
    if not settings.metrics_address:
        return Check("daemon", None, "metrics_address is off: a running daemon cannot be asked")
    url, tls = local_url(settings, "/healthz")
    try:
        with urllib.request.urlopen(url, timeout=5, context=tls) as response:
            health = json.load(response)
    except urllib.error.HTTPError as exc:  # 503: it runs, and says it is not healthy
        return Check("daemon", False, f"running but unhealthy at {url}: {exc.read().decode(errors='replace')[:300]}")
    except OSError:
        return Check("daemon", None, f"none answers at {url} (not running here)")
    children = _status(settings).get("children") or {}
    if children.get("fell_back"):
        return Check(
            "daemon",
            False,
            f"running, but without its fork server (it spawns warm children instead, slower to start): "
            f"{children['fell_back']} (work_dir/children.log says why)",
        )
    starts = f"; children start by {children['mode']}, fork server {children.get('fork_server')}" if children else ""
    return Check("daemon", True, f"running: {', '.join(f'{key} {value}' for key, value in health.items())}{starts}")


def _status(settings: Settings) -> dict[str, Any]:
    url, tls = local_url(settings, "/status")
    try:
        with urllib.request.urlopen(url, timeout=5, context=tls) as response:
            return dict(json.load(response))
    except (OSError, ValueError):
        return {}
