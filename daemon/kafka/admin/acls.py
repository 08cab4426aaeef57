"""Who may write a topic, as the brokers' ACLs say: for `adapterd doctor`'s check of the fleet's topics
against docs/guarantees.md's recipe (daemon/kafka/admin/acl_recipe.py).

Whoever can write `adapterd.events` speaks for the fleet to every consumer, and whoever can write the
claims topic puts work where a host runs it, so a host should know whether its own principal may write
what it writes (its records would be refused otherwise) and who else may.
The brokers answer DescribeAcls (aiokafka 0.14's admin client has no call for it: the request is
sent with aiokafka's own client and protocol classes) with the ACLs whose patterns match the topic:
its literal name, `*`, and prefixes of it. A broker without an authorizer answers that security is
disabled: then anyone who reaches it may write any topic. Kafka's super users (`super.users`) may
write whatever the ACLs say; the brokers do not list them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaClient
from aiokafka.errors import for_code
from aiokafka.protocol.admin import DescribeAclsRequest

from daemon.kafka.options import kafka_options
from daemon.settings import Settings

# Kafka's enums as the protocol carries them (org.apache.kafka.common.resource and .acl).
TOPIC, MATCH = 2, 2
ANY, ALL, WRITE = 1, 2, 4
DENY, ALLOW = 2, 3
ANYONE = "User:*"


@dataclass(frozen=True)
class Acl:
    """One ACL of a resource pattern that matches the topic."""

    principal: str
    host: str
    operation: int
    permission: int
    pattern: str  # the resource name of the pattern: the topic, "*", or a prefix of it


@dataclass(frozen=True)
class Writers:
    """Whether `principal` may write the topic, and which other principals may."""

    principal: str
    may_write: bool
    others: tuple[str, ...]  # allowed besides it; ANYONE among them when every principal may

    @property
    def anyone(self) -> bool:
        return ANYONE in self.others


def principal_of(settings: Settings) -> str:
    """The principal the brokers see this host as (with their default principal mapping)."""
    if settings.security_protocol.startswith("SASL_"):
        return f"User:{settings.sasl_username}"
    if settings.security_protocol == "SSL" and settings.ssl_certfile is not None:
        return f"User:{_certificate_subject(settings.ssl_certfile)}"
    return "User:ANONYMOUS"


def _certificate_subject(path: Path) -> str:
    from cryptography import x509

    return x509.load_pem_x509_certificate(path.read_bytes()).subject.rfc4514_string()


async def topic_acls(settings: Settings, topic: str, timeout_ms: int) -> list[Acl]:
    """The ACLs that match `topic`; aiokafka's SecurityDisabled without an authorizer,
    ClusterAuthorizationFailedError when this principal may not describe them."""
    return (await topics_acls(settings, [topic], timeout_ms))[topic]


async def topics_acls(settings: Settings, topics: list[str], timeout_ms: int) -> dict[str, list[Acl]]:
    """The ACLs that match each of `topics`, asked over one connection; raises as `topic_acls`."""
    client = AIOKafkaClient(**kafka_options(settings), request_timeout_ms=timeout_ms)
    found: dict[str, list[Acl]] = {}
    try:
        await client.bootstrap()
        for topic in topics:
            response = await client.send(
                client.get_random_node(),
                DescribeAclsRequest(
                    resource_type=TOPIC,
                    resource_name=topic,
                    resource_pattern_type_filter=MATCH,
                    principal=None,
                    host=None,
                    operation=ANY,
                    permission_type=ANY,
                ),
            )  # None: any principal, any host
            if response.error_code:
                raise for_code(response.error_code)(response.error_message)
            found[topic] = [
                Acl(principal, host, operation, permission, name)
                for _type, name, _pattern_type, acls in response.resources
                for principal, host, operation, permission in acls
            ]
    finally:
        await client.close()
    return found


def writers(acls: list[Acl], principal: str) -> Writers:
    """Kafka's rule for WRITE on the topic: a DENY that names the principal (or everyone) wins,
    else an ALLOW of Write or All does; with no ACL at all, only super users may."""
    writing = [acl for acl in acls if acl.operation in (WRITE, ALL)]
    denied = {acl.principal for acl in writing if acl.permission == DENY}
    allowed = {acl.principal for acl in writing if acl.permission == ALLOW}
    mine = bool({principal, ANYONE} & allowed) and not {principal, ANYONE} & denied
    others = () if ANYONE in denied else tuple(sorted(allowed - denied - {principal}))
    return Writers(principal, mine, others)
