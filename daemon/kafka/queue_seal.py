"""The fleet's signature on the records a host writes into the queue's topics (issue 61): only a host
can put a record where a host runs it (the claims topic) or vouch for its place in a class's queue.

Every record a host writes into the claims topic or a class's topic (a claim, the records before it
written again, a move to the class a request names, a retry, a preempted job sent back) carries the
`adapterd-queue-signature` header: the fleet's Ed25519 signature (schemas/signing.py, the key that
signs its events) over `signed_bytes`, the one canonical encoding of what decides about the record:
its target topic and partition (none: any partition, chosen by its key), its key and value bytes, its
class, its team and its arrival. The header carries the fields the bytes are built from and the
signature, `1;<arrival ms>;<partition or empty>;<class>;<team>;ed25519:<key id>:<base64>`; the key
and value are the record's own, and the topic is the one it is read from, so a signature moved to
another record, partition, class or topic does not verify.

What it does not stop: a genuine record written again verbatim where it was (a replay into the same
partition) verifies; the topics' ACLs (docs/guarantees.md, "Whom to trust") keep everyone but the
fleet off them, and a request trained once already is published as a duplicate of its Hub commit.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from daemon.kafka.records import Record
from daemon.settings.fleet import CLASS_HEADER
from daemon.settings.secret_files import event_keys, event_signer
from schemas.common import AdapterdError
from schemas.signing import SIGNATURE_HEADER, EventKeys, EventSigner, UnverifiedEvent

SEAL_HEADER = "adapterd-queue-signature"
_VERSION = b"1"
_DOMAIN = b"adapterd-queue-signature/1\x00"  # never the bytes of an event: an event's signature verifies no record here


@dataclass(frozen=True)
class Sealed:
    """What the fleet signed of a record: when the request arrived, its class and team, and the partition
    it was written to (None: any, by its key)."""

    arrival_ms: int
    priority_class: str
    team: str
    partition: int | None


class Unsealed(AdapterdError, ValueError):
    """A record without a valid queue signature of a trusted key; the message says why."""


def _field(data: bytes) -> bytes:
    return len(data).to_bytes(8, "big") + data


def signed_bytes(topic: str, partition: int | None, key: bytes | None, value: bytes, sealed: Sealed) -> bytes:
    """The one encoding of what the signature covers: each field length-prefixed, a null key told from an empty one."""
    assert sealed.partition == partition
    parts = [
        topic.encode(),
        b"" if partition is None else str(partition).encode(),
        b"-" if key is None else b"+" + key,
        value,
        sealed.priority_class.encode(),
        sealed.team.encode(),
        str(sealed.arrival_ms).encode(),
    ]
    return _DOMAIN + b"".join(_field(part) for part in parts)


def _parsed(header: bytes) -> tuple[Sealed, bytes]:
    parts = header.split(b";")
    if len(parts) != 6 or parts[0] != _VERSION:
        raise Unsealed(f"malformed {SEAL_HEADER} header: {header[:60]!r}")
    _, arrival, partition, priority_class, team, signature = parts
    try:
        sealed = Sealed(int(arrival), priority_class.decode(), team.decode(), int(partition) if partition else None)
    except (ValueError, UnicodeDecodeError):
        raise Unsealed(f"malformed {SEAL_HEADER} header: {header[:60]!r}") from None
    return sealed, signature


class QueueSeal:
    """Signs the host's queue records (`headers`) and checks a record's signature (`read`)."""

    def __init__(self, signer: EventSigner | None, keys: EventKeys | None) -> None:
        self.signer = signer
        self.keys = keys

    @classmethod
    def from_settings(cls, settings: object) -> QueueSeal:
        return cls(event_signer(settings), event_keys(settings))

    @property
    def verifies(self) -> bool:
        """Whether this host checks signatures: with a key to check by (its own signing key's, at least)."""
        return self.keys is not None

    @property
    def writes_trusted(self) -> bool:
        """Whether the copies this host writes are taken: signed, or the fleet checks nothing (no key at all). A host
        that checks signatures but cannot sign would claim what every host, itself included, refuses."""
        return self.signer is not None or self.keys is None

    def headers(
        self,
        topic: str,
        partition: int | None,
        key: bytes | None,
        value: bytes,
        priority_class: str,
        team: str,
        arrival_ms: int,
    ) -> tuple[tuple[str, bytes], ...]:
        """The signature header of a record the host writes to `topic`; none without a signing key."""
        if self.signer is None:
            return ()
        sealed = Sealed(arrival_ms, priority_class, team, partition)
        signature = self.signer.sign(signed_bytes(topic, partition, key, value, sealed))
        fields = [
            _VERSION,
            str(arrival_ms).encode(),
            b"" if partition is None else str(partition).encode(),
            priority_class.encode(),
            team.encode(),
            signature,
        ]
        return ((SEAL_HEADER, b";".join(fields)),)

    def read(
        self,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: Iterable[tuple[str, bytes | None]] | None,
    ) -> Sealed:
        """What the fleet signed of a record read from `topic`'s `partition`; Unsealed says why not."""
        if self.keys is None:
            raise Unsealed("this host has no key to check the fleet's signature by")
        found = [header for name, header in headers or () if name == SEAL_HEADER]
        if not found:
            raise Unsealed(f"unsigned: no {SEAL_HEADER} header")
        if len(found) > 1 or found[0] is None:
            raise Unsealed(f"malformed: {len(found)} {SEAL_HEADER} headers, or one without a value")
        sealed, signature = _parsed(found[0])
        if sealed.partition is not None and sealed.partition != partition:
            raise Unsealed(f"signed for partition {sealed.partition} of {topic}, read from partition {partition}")
        try:
            self.keys.verify(
                signed_bytes(topic, sealed.partition, key, value or b"", sealed), [(SIGNATURE_HEADER, signature)]
            )
        except UnverifiedEvent as exc:
            raise Unsealed(f"{exc} (over the record's topic, key, value, class, team and arrival)") from None
        return sealed


def claim_refusal(seal: QueueSeal, record: Record) -> str | None:
    """Why a record of the claims topic is not a claim the fleet wrote (intake rejects it: docs/guarantees.md),
    or None. A host without any key checks nothing (the daemon's start-up refuses priority classes without
    one; `QueueSeal.verifies`)."""
    if not seal.verifies:
        return None
    try:
        sealed = seal.read(record.topic, record.partition, record.key, record.value, record.headers)
    except Unsealed as exc:
        return f"not a claim the fleet wrote: {exc}"
    if sealed.partition is None:
        return "signed for any partition: a claim the fleet writes names its claims partition"
    named = [value for name, value in record.headers or () if name == CLASS_HEADER]
    if named != [sealed.priority_class.encode()]:
        return f"its {CLASS_HEADER} header is not the one class the fleet signed ({sealed.priority_class})"
    return None
